"""Checkpoints (runs/checkpoints.py, read by runs/task.load_checkpoint): loaded without running code, whatever
asks (our own load, Lightning's resume, train.py resume=); a broken one, or one of another model or
vocabulary, refused in one line naming the file; written atomically, so that a failed or killed save keeps the
previous file; never saved with non-finite weights. A run folder copied or moved, then resumed: the checkpoint
callbacks (RunCheckpoint) keep the best score and find the best and last checkpoints in the new folder, where
Lightning's own ModelCheckpoint keeps the old folder's best_model_path and forgets the score."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from robustness_helpers import TINY, assert_untouched, compose_in, error_line, fingerprint, run_script, train

from gru_experiments.data.corpus import prepare_corpus
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.runs import checkpoints
from gru_experiments.runs.checkpoints import (
    AtomicCheckpointIO,
    RunCheckpoint,
    StepCheckpoint,
    atomic_torch_save,
    read_checkpoint,
)
from gru_experiments.runs.task import LanguageModelTask, load_checkpoint
from gru_experiments.runs.training import checkpoint_callbacks


def finished_checkpoint(root: Path) -> Path:
    return root / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000" / "checkpoints" / "last.ckpt"


class RunsCode:
    """Unpickling this calls Path.touch(marker): what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def malicious_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "tokenizer": {"kind": "char", "chars": ["a"]},
                "optimizer_states": [], "lr_schedulers": [], "loops": {}, "payload": RunsCode(marker)}, path)
    with open(path, "rb") as f:  # the file really would run code if unpickled normally
        assert b"touch" in f.read()
    return path, marker


def test_malicious_checkpoint_is_refused_and_runs_nothing(tmp_path):
    path, marker = malicious_checkpoint(tmp_path)
    with pytest.raises(UserError) as info:
        load_checkpoint(path)
    # (Python pickles the method Path.touch as getattr(Path, "touch"): getattr is the global refused.)
    assert str(info.value) == (f"refusing to load {path}: it contains a reference to the Python object getattr, "
                               "which could run code when unpickled; only tensors and plain data are loaded "
                               "(weights_only), so this file cannot be used")
    # Lightning's own resume path goes through the checkpoint plugin, also weights-only.
    with pytest.raises(UserError, match="refusing to load"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()
    # Control: the same file unpickled normally does run the code.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_lightning_fit_resume_path_refuses_malicious_checkpoint(tmp_path, tiny_corpus):
    """trainer.fit(ckpt_path=...) itself, as train() calls it, not only our own pre-check."""
    path, marker = malicious_checkpoint(tmp_path)
    cfg = compose_in(tmp_path, f"data.path={tiny_corpus}")
    corpus = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok")
    from gru_experiments.data.batches import CorpusDataModule

    task = LanguageModelTask({"_target_": "gru_experiments.models.recurrent.RecurrentLM", "cell": "gru",
                              "embedding_dim": 8, "hidden_size": 8}, corpus.tokenizer.vocab_size,
                             lr=1e-3, optim={"name": "original", "weight_decay": 0.0}, epochs=1,
                             tokenizer=corpus.tokenizer)
    data = CorpusDataModule(corpus.train_ids, corpus.val_ids, 4, 16, 2)
    for weights_only in [None, False]:  # the plugin decides, whatever Lightning is told
        trainer = Trainer(plugins=[AtomicCheckpointIO()], max_steps=1, logger=False, enable_progress_bar=False,
                          enable_checkpointing=False, accelerator="cpu", default_root_dir=tmp_path)
        with pytest.raises(UserError, match="refusing to load"):
            trainer.fit(task, datamodule=data, ckpt_path=path, weights_only=weights_only)
        assert not marker.exists()


def test_broken_checkpoints(workspace, tmp_path):
    good = finished_checkpoint(workspace)
    with pytest.raises(UserError, match=f"^checkpoint not found: {tmp_path / 'nope.ckpt'}$"):
        load_checkpoint(tmp_path / "nope.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(UserError, match=r"truncated\.ckpt is not a readable checkpoint \(truncated or not a "
                                        r"checkpoint file\)"):
        load_checkpoint(truncated)
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    with pytest.raises(UserError, match=r"notes\.ckpt is not a readable checkpoint \(truncated or not a checkpoint "
                                        r"file\): Unsupported operand 110$"):
        load_checkpoint(text)
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor)
    with pytest.raises(UserError, match=r"tensor\.pt is not a gru-experiments checkpoint \(it holds a Tensor\)"):
        load_checkpoint(tensor)
    weights = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, weights)
    with pytest.raises(UserError, match=r"not a gru-experiments checkpoint \(it lacks hyper_parameters, tokenizer\)"):
        load_checkpoint(weights)


def test_a_folder_or_another_vocabulary_is_refused_in_one_line(tmp_path):
    """read_checkpoint on a folder, and check_tokenizer on a checkpoint whose vocabulary has this config's kind and
    size but other characters (another corpus) or whose tokenizer kind is unknown: each one line naming the file."""
    from gru_experiments.runs.checkpoints import check_tokenizer, weight_shapes

    (tmp_path / "last.ckpt").mkdir()
    with pytest.raises(UserError, match=f"^checkpoint path is not a file: {tmp_path / 'last.ckpt'}$"):
        read_checkpoint(tmp_path / "last.ckpt")
    ours, theirs = CharTokenizer.from_text("abc"), CharTokenizer.from_text("xyz")
    check_tokenizer(ours.state_dict(), ours.vocab_size, "run.ckpt", CharTokenizer.from_text("cab"))  # the same
    with pytest.raises(UserError, match=re.escape(
            "checkpoint run.ckpt was trained with a different char vocabulary of the same size (another corpus or "
            "tokenizer settings?); resume with the run's own data.path")):
        check_tokenizer(theirs.state_dict(), theirs.vocab_size, "run.ckpt", ours)
    with pytest.raises(UserError, match=re.escape(
            "checkpoint run.ckpt was trained with an unknown tokenizer ('bytes'), but this config builds a char "
            "tokenizer (3 characters)")):
        check_tokenizer({"kind": "bytes"}, 256, "run.ckpt", ours)
    assert weight_shapes(None) == {} and weight_shapes({"w": torch.zeros(2, 3), "n": 4}) == {"w": (2, 3)}


def test_a_checkpoint_that_does_not_build_its_model_is_refused_in_one_line(tmp_path):
    """load_checkpoint on a checkpoint that reads but does not build: a model class outside the package (never
    imported), weights of another model, a tokenizer of another size than the model's vocabulary."""
    architecture = {"_target_": "gru_experiments.models.recurrent.RecurrentLM", "cell": "gru", "embedding_dim": 8,
                    "hidden_size": 8}
    tokenizer = CharTokenizer.from_text("abcdef")
    task = LanguageModelTask(architecture, tokenizer.vocab_size, lr=1e-3, optim={"name": "original"},
                             tokenizer=tokenizer)
    good = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
            "tokenizer": tokenizer.state_dict()}

    def saved(name: str, **changes) -> Path:
        torch.save({**good, **changes}, tmp_path / name)
        return tmp_path / name

    assert load_checkpoint(saved("good.ckpt")).model.vocab_size == 6
    outside = {**good["hyper_parameters"], "architecture": {**architecture, "_target_": "os.system"}}
    for name, changes, refused in (
            ("outside.ckpt", {"hyper_parameters": outside}, "refusing to build 'os.system' from a checkpoint: only "
                                                             "classes in gru_experiments are built"),
            ("other.ckpt", {"state_dict": {}}, "Error(s) in loading state_dict for LanguageModelTask:"),
            ("sizes.ckpt", {"tokenizer": CharTokenizer.from_text("abc").state_dict()},
             "is inconsistent: its tokenizer has 3 symbols but its model 6")):
        path = saved(name, **changes)
        with pytest.raises(UserError) as error:
            load_checkpoint(path)
        assert str(error.value).startswith(str(path)) and refused in str(error.value)
        assert "\n" not in str(error.value)


def test_checkpoint_writes_are_atomic_and_last_is_a_file(compose_config, tiny_corpus, tmp_path, monkeypatch):
    written = []
    original = checkpoints.atomic_torch_save
    monkeypatch.setattr(checkpoints, "atomic_torch_save", lambda obj, path: written.append(Path(path)) or
                        original(obj, path))
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=3", "model.epochs=1",
                                   "checkpoint.every_n_steps=2"))
    last = Path(summary["checkpoint"])
    assert last.name == "last.ckpt" and last.is_file() and not last.is_symlink()
    assert written.count(last) >= 2  # periodic (step 2) and epoch end (step 3), all through the atomic writer
    assert {p.name for p in last.parent.iterdir()} == {"last.ckpt", Path(summary["best_checkpoint"]).name}


def test_last_checkpoint_holds_the_final_step_when_max_steps_stops_between_checkpoints(compose_config, tiny_corpus):
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=8", "model.epochs=2",
                                   "trainer.max_steps=13", "checkpoint.every_n_steps=3"))
    assert read_checkpoint(summary["checkpoint"])["global_step"] == summary["train_steps"] == 13


def test_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, path)

    def dies_halfway(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert os.listdir(tmp_path) == ["last.ckpt"]


SAVER = textwrap.dedent("""
    import sys, torch
    from gru_experiments.runs.checkpoints import atomic_torch_save
    path, step = sys.argv[1], 0
    big = torch.randn(30_000_000)  # 120 MB: each save takes a while
    while True:
        step += 1
        atomic_torch_save({"step": step, "weights": big}, path)
""")


@pytest.mark.slow
def test_sigkill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=dict(os.environ, PYTHONPATH=str(
        Path(__file__).resolve().parents[1])))
    try:
        deadline = time.monotonic() + 120
        # Wait for one complete save, then for the next one to be under way.
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        while not list(tmp_path.glob(".last.ckpt.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert time.monotonic() < deadline, "the saver never got going"
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait()
    assert saver.returncode == -signal.SIGKILL
    checkpoint = torch.load(path, weights_only=True)  # complete and readable
    assert checkpoint["step"] >= 1 and checkpoint["weights"].numel() == 30_000_000


def test_checkpoint_with_non_finite_weights_is_not_saved(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 5, "state_dict": {"w": torch.ones(2)}}, path)
    with pytest.raises(TrainingDiverged, match=r"weights became non-finite \(w\) at step 6; not saved, the last "
                                               rf"good checkpoint is kept: {path} \(step 5\)"):
        io.save_checkpoint({"global_step": 6, "state_dict": {"w": torch.tensor([1.0, float("nan")])}}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 5


@pytest.mark.slow
def test_train_py_refuses_malicious_checkpoint_on_resume(workspace, tmp_path):
    run = workspace / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-01_000000"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("[]\n")
    (run / "checkpoints").mkdir()
    evil, marker = malicious_checkpoint(tmp_path)
    os.replace(evil, run / "checkpoints" / "last.ckpt")
    before = fingerprint(workspace)
    result = run_script(workspace, f"resume={run}")
    assert result.returncode == 2
    assert error_line(result.stderr).startswith(f"error: refusing to load {run / 'checkpoints' / 'last.ckpt'}")
    assert not marker.exists()
    assert_untouched(before, fingerprint(workspace))


# --- a run folder copied or moved, then resumed: the checkpoint callbacks (runs/checkpoints.RunCheckpoint) ----

def saved_state(folder):
    best = str(folder / "best-epoch3-step80.ckpt")
    return {"monitor": "val/loss", "best_model_score": torch.tensor(1.25), "best_model_path": best,
            "current_score": torch.tensor(1.3), "dirpath": str(folder), "best_k_models": {best: torch.tensor(1.25)},
            "kth_best_model_path": best, "kth_value": torch.tensor(1.25), "last_model_path": str(folder / "last.ckpt")}


def test_a_moved_folder_keeps_its_best_score_and_finds_its_checkpoints_in_the_new_place(tmp_path):
    old, new = tmp_path / "run" / "checkpoints", tmp_path / "copy" / "checkpoints"
    callback = RunCheckpoint(dirpath=new, monitor="val/loss", mode="min", save_top_k=1, save_last=True)
    callback.load_state_dict(saved_state(old))
    assert callback.best_model_path == str(new / "best-epoch3-step80.ckpt")
    assert callback.kth_best_model_path == callback.best_model_path
    assert callback.last_model_path == str(new / "last.ckpt")
    assert list(callback.best_k_models) == [callback.best_model_path]
    assert float(callback.best_model_score) == 1.25  # a later, worse validation is not the best


def test_lightnings_own_callback_is_what_it_fixes(tmp_path):
    """If Lightning ever keeps the moved state itself, RunCheckpoint can go."""
    old, new = tmp_path / "run" / "checkpoints", tmp_path / "copy" / "checkpoints"
    plain = ModelCheckpoint(dirpath=new, monitor="val/loss", mode="min", save_top_k=1)
    plain.load_state_dict(saved_state(old))
    assert plain.best_model_path == str(old / "best-epoch3-step80.ckpt") and plain.best_model_score is None


def test_the_same_folder_restores_as_lightning_does(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    callback = RunCheckpoint(dirpath=folder, monitor="val/loss", mode="min", save_top_k=1)
    callback.load_state_dict(saved_state(folder))
    assert callback.best_model_path == str(folder / "best-epoch3-step80.ckpt") and float(callback.kth_value) == 1.25


def test_the_training_uses_it_for_both_checkpoints(tmp_path):
    best, periodic = checkpoint_callbacks(tmp_path, every_n_steps=50)
    assert type(best) is RunCheckpoint and isinstance(periodic, StepCheckpoint) and isinstance(periodic, RunCheckpoint)
