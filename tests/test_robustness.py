"""Bad input fails fast with one clear line and damages nothing; checkpoints load without
running code and are written atomically; a diverging run stops and keeps its good checkpoint;
runs started together share the SentencePiece cache safely."""

from __future__ import annotations

import json
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
from omegaconf import OmegaConf
from robustness_helpers import (
    TINY,
    TRAIN_PY,
    assert_untouched,
    compose_in,
    error_line,
    fail_in_process,
    fingerprint,
    run_script,
    start_script,
)

from gru_experiments.data.corpus import prepare_corpus
from gru_experiments.data.tokenizers import CharTokenizer, SentencePieceTokenizer, encode_prompt
from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.runs import checkpoints
from gru_experiments.runs.checkpoints import AtomicCheckpointIO, atomic_torch_save, read_checkpoint
from gru_experiments.runs.checks import validate
from gru_experiments.runs.jobs import job
from gru_experiments.runs.loggers import WANDB_MODES, wandb_mode
from gru_experiments.runs.task import LanguageModelTask, load_checkpoint
from gru_experiments.runs.training import train
from gru_experiments.study.generation import validate_sampling


def finished_checkpoint(root: Path) -> Path:
    return root / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def bad_corpora(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    files = {"empty": b"", "latin1": "Ce soir-là, à l'été\n".encode("latin-1") * 50, "short": b"To be, or not."}
    for name, data in files.items():
        (folder / f"{name}.txt").write_bytes(data)
    return {name: folder / f"{name}.txt" for name in files} | {"missing": folder / "missing.txt",
                                                                 "folder": folder}


BAD_VALUES = {
    "model.lr=-1": "invalid model.lr=-1: must be a number > 0",
    "model.lr=0": "invalid model.lr=0: must be a number > 0",
    "model.lr=fast": "invalid model.lr='fast': must be a number > 0",
    "data.seq_len=1": "invalid data.seq_len=1: must be an integer >= 2",
    "data.batch_size=0": "invalid data.batch_size=0: must be an integer >= 1",
    "model.architecture.dropout=-0.1": "invalid model.architecture.dropout=-0.1: must be a number in [0, 1)",
    "model.architecture.dropout=1.0": "invalid model.architecture.dropout=1.0: must be a number in [0, 1)",
    "trainer.precision=fp8": "invalid trainer.precision='fp8': must be one of",
    "trainer.precision=17": "invalid trainer.precision=17: must be one of",
    "checkpoint.every_n_steps=-5": "invalid checkpoint.every_n_steps=-5",
    "evaluation.window=0": "invalid evaluation.window=0: must be null (the training data.seq_len) or an integer >= 1",
    "evaluation.streams=0": "invalid evaluation.streams=0: must be an integer >= 1",
    "evaluation.budget=0": "invalid evaluation.budget=0: must be null (every figure exact) or a number > 0",
    "evaluation.budget=sometimes": "invalid evaluation.budget='sometimes'",
    "evaluation.curve_longest=-1": "invalid evaluation.curve_longest=-1",
    "evaluation.samples.chars=0": "invalid evaluation.samples.chars=0: must be an integer >= 1",
    "evaluation.samples.temperature=-1": "invalid evaluation.samples.temperature=-1: must be a number >= 0",
}


@pytest.mark.parametrize("override", BAD_VALUES)
def test_invalid_values_are_caught_before_any_work(workspace, tiny_corpus, capsys, monkeypatch, override):
    monkeypatch.setattr("gru_experiments.runs.training.prepare_corpus",
                        lambda *a, **k: pytest.fail("work started despite an invalid value"))
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", override))
    assert BAD_VALUES[override] in line
    assert_untouched(before, fingerprint(workspace))


def test_valid_precisions_pass_to_the_trainer():
    for precision in ["32-true", "bf16-mixed", "16-mixed", "64-true", 32, "bf16"]:
        spec = validate(compose_in(Path("/tmp"), f"trainer.precision={precision}"))
        assert spec.precision == spec.trainer["precision"] == precision


@pytest.mark.parametrize("case, expected", [
    ("missing", r"corpus file not found: .*missing\.txt \(data\.path\)"),
    ("folder", r"corpus path is not a file"),
    ("empty", r"corpus file is empty: .*empty\.txt"),
    ("latin1", r"corpus file is not UTF-8 text: .*latin1\.txt \(byte 0xe0 at offset 9, line 1; convert it"),
    ("short", r"corpus too short: the training split of .*short\.txt has 12 characters, fewer than one training "
              r"window plus one \(data\.seq_len \+ 1 = 33\)"),
])
def test_bad_corpus(workspace, bad_corpora, capsys, case, expected):
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={bad_corpora[case]}"))
    assert re.search(expected, line), line
    assert_untouched(before, fingerprint(workspace))


def test_too_short_in_tokens_after_subword_encoding(workspace, tiny_corpus, capsys):
    # 20,000 characters are long enough in characters but not in SentencePiece tokens.
    cfg = compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm", "tokenizer.vocab_size=60",
                     "data.seq_len=17000")
    assert re.search(r"training split of .* has \d+ tokens, fewer than one training window plus one",
                     fail_in_process(capsys, cfg))


def test_spm_vocabulary_too_large_for_the_corpus(workspace, tiny_corpus, capsys):
    before = fingerprint(workspace)
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm",
                                              "tokenizer.vocab_size=500"))
    assert re.fullmatch(r"error: tokenizer\.vocab_size=500 is too large for this corpus: SentencePiece can make at "
                        r"most (\d+) pieces from its training split; set tokenizer\.vocab_size=\1 or lower \(where no "
                        r"size fits both bounds, the text is too small for SentencePiece: use tokenizer=char\)", line)
    assert_untouched(before, fingerprint(workspace))  # no half-trained model in the cache


def test_spm_vocabulary_smaller_than_the_alphabet(workspace, tiny_corpus, capsys):
    line = fail_in_process(capsys, compose_in(workspace, f"data.path={tiny_corpus}", "tokenizer=spm",
                                              "tokenizer.vocab_size=10"))
    assert re.search(r"tokenizer\.vocab_size=10 is too small for this corpus: SentencePiece needs \d+ pieces, one "
                     r"for each distinct character", line)


def test_validation_split_with_characters_the_training_split_lacks_is_accepted(tmp_path, workspace):
    # Refused once; now the char vocabulary is the whole corpus's characters (tests/test_any_text.py
    # trains such a corpus end to end).
    corpus = tmp_path / "new_chars.txt"
    corpus.write_text("abc " * 300 + "xyz€")
    cfg = compose_in(workspace, f"data.path={corpus}")
    prepared = prepare_corpus(cfg.data, cfg.tokenizer, tmp_path / "tok")
    assert prepared.tokenizer.chars == sorted("abc xyz€")


# --- sampling settings and prompts (used by sample.py) ---------------------------------------

@pytest.mark.parametrize("settings, expected", [
    ({"temperature": -1.5}, "invalid temperature=-1.5: must be a number >= 0 (0: greedy, the argmax)"),
    ({"temperature": None}, "invalid temperature=None: must be a number >= 0"),
    ({"top_k": 0}, "invalid top_k=0: must be null (off) or an integer from 1 to the vocabulary size 65"),
    ({"top_k": 66}, "invalid top_k=66"),
    ({"top_p": 0.0}, "invalid top_p=0.0: must be null (off) or a number in (0, 1]"),
    ({"top_p": 1.5}, "invalid top_p=1.5"),
    ({"num_samples": 0}, "invalid num_samples=0: must be an integer >= 1"),
    ({"num_samples": 2.5}, "invalid num_samples=2.5: must be an integer >= 1"),
    ({"num_samples": None}, "invalid num_samples=None: must be an integer >= 1"),
    ({"max_new_tokens": -5}, "invalid max_new_tokens=-5: must be an integer >= 1"),
    ({"max_new_tokens": 0}, "invalid max_new_tokens=0: must be an integer >= 1"),
    ({"max_new_tokens": "many"}, "invalid max_new_tokens='many': must be an integer >= 1"),
    ({"window": 0}, "invalid window=0: must be null or an integer >= 1"),
    ({"window": True}, "invalid window=True"),
    ({"seed": "lucky"}, "invalid seed='lucky': must be an integer"),
    ({"greedy": "yes"}, "invalid greedy='yes': must be true or false"),
])
def test_validate_sampling_rejects(settings, expected):
    with pytest.raises(UserError) as info:
        validate_sampling(settings, vocab_size=65)
    assert str(info.value).startswith(expected)


def test_validate_sampling_accepts_and_names_keys_with_prefix():
    validate_sampling({"temperature": 0.8, "top_k": 65, "top_p": 1.0}, vocab_size=65)
    validate_sampling({"temperature": 1, "top_k": None, "top_p": None}, vocab_size=65)
    validate_sampling({"temperature": 0}, vocab_size=65)  # 0: greedy, the argmax
    with pytest.raises(UserError, match=r"invalid sample\.top_k=1000"):
        validate_sampling({"top_k": 1000}, vocab_size=65, prefix="sample.")
    # The sizes: absent keys are skipped, a window may be null (the caller's default).
    validate_sampling({"num_samples": 1, "max_new_tokens": 1, "window": None, "seed": -3, "greedy": True}, 65)
    validate_sampling({"num_samples": 100, "max_new_tokens": 2000, "window": 256}, 65)
    # Before the checkpoint is read the vocabulary is unknown: top_k is only checked to be >= 1.
    validate_sampling({"top_k": 1000}, vocab_size=None)
    with pytest.raises(UserError, match=r"invalid top_k=0: must be null \(off\) or an integer from 1 to the "
                                        r"vocabulary size$"):
        validate_sampling({"top_k": 0}, vocab_size=None)
    # A DictConfig (sample.py's whole config) reads the same.
    with pytest.raises(UserError, match=r"invalid evaluation\.window=0"):
        validate_sampling(OmegaConf.create({"window": 0}), None, prefix="evaluation.")


# --- WANDB_MODE -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, shown", [("", "'' (an empty string)"), ("onlin", "'onlin'"), ("OFFLINE", "'OFFLINE'")])
def test_wandb_mode_wandb_would_refuse_is_a_user_error(monkeypatch, value, shown):
    monkeypatch.setenv("WANDB_MODE", value)
    with pytest.raises(UserError) as info:
        wandb_mode()
    assert str(info.value).startswith(f"invalid WANDB_MODE={shown} (environment variable): must be online, offline "
                                      "or disabled")


def test_wandb_modes_wandb_accepts_pass(monkeypatch):
    for value in WANDB_MODES:
        monkeypatch.setenv("WANDB_MODE", value)
        assert wandb_mode() == value
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    assert wandb_mode() == "offline"  # unset: the project's choice
    # The same set as the installed wandb's own settings.
    from typing import get_args

    from wandb.sdk.wandb_settings import Settings

    assert set(WANDB_MODES) == set(get_args(Settings.model_fields["mode"].annotation))


@pytest.mark.parametrize("value", ["", "bogus"])
@pytest.mark.slow
def test_train_py_with_a_bad_wandb_mode_fails_before_the_run_folder(workspace, tiny_corpus, monkeypatch, value):
    """The default logger=wandb: the error comes from validate(cfg), before any work, and no run
    folder is left behind (wandb itself would fail with a pydantic traceback after it was made)."""
    before = fingerprint(workspace)
    result = run_script(workspace, f"data.path={tiny_corpus}", "data.batch_size=8", "data.seq_len=32",
                        "trainer.accelerator=cpu", WANDB_MODE=value)
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_line(result.stderr).startswith(f"error: invalid WANDB_MODE={value!r}")
    assert_untouched(before, fingerprint(workspace))
    # logger=csv does not use W&B, so the variable does not matter to it.
    monkeypatch.setenv("WANDB_MODE", value)
    validate(compose_in(workspace, f"data.path={tiny_corpus}", "logger=csv"))
    with pytest.raises(UserError, match="invalid WANDB_MODE"):
        validate(compose_in(workspace, f"data.path={tiny_corpus}", "logger=wandb"))


def test_prompt_with_unknown_characters(tmp_path, capsys):
    char = CharTokenizer.from_text("ROMEO: hello\n")
    with pytest.raises(UserError) as info:
        encode_prompt(char, "ROMEO: héllo ✓", drop_unknown=False)
    assert str(info.value) == ("the prompt has characters this model's char vocabulary lacks: 'é' (U+00E9), "
                               "'✓' (U+2713); remove them, or drop them with drop_unknown=true")
    assert char.decode(encode_prompt(char, "ROMEO: héllo ✓", drop_unknown=True)) == "ROMEO: hllo "
    assert "'é' (U+00E9), '✓' (U+2713)" in capsys.readouterr().err

    spm = SentencePieceTokenizer.train("the cat sat on the mat\n" * 200, 12, tmp_path)
    with pytest.raises(UserError, match=r"spm vocabulary lacks: 'Z' \(U\+005A\)"):
        encode_prompt(spm, "the Zat", drop_unknown=False)  # spm would silently make it <unk>
    assert spm.decode(encode_prompt(spm, "the Zat", drop_unknown=True)) == "the at"


# --- checkpoints ------------------------------------------------------------------------------

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


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(compose_config, tiny_corpus, tmp_path,
                                                                            monkeypatch, capsys):
    original = LanguageModelTask.on_train_batch_end

    def poison_after_step_3(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == 3:  # after step 3's checkpoint was written
            with torch.no_grad():
                self.model.head.weight.fill_(float("nan"))

    monkeypatch.setattr(LanguageModelTask, "on_train_batch_end", poison_after_step_3)
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=10", "model.epochs=1",
                         "checkpoint.every_n_steps=1")
    line = fail_in_process(capsys, cfg)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert line == (f"error: training diverged: the loss is nan at training step 4 (epoch 0); stopped, the last good "
                    f"checkpoint is kept: {last} (step 3); try a lower model.lr")
    checkpoint = read_checkpoint(last)
    assert checkpoint["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())  # the run says it diverged
    assert summary["status"] == "failed" and summary["error"] == "TrainingDiverged: " + line.removeprefix("error: ")


# --- the scripts themselves -------------------------------------------------------------------

@pytest.mark.slow
def test_train_py_bad_value_one_line_exit_2_nothing_damaged(workspace, tiny_corpus):
    before = fingerprint(workspace)
    result = run_script(workspace, f"data.path={tiny_corpus}", *TINY, "model.lr=-1")
    assert result.returncode == 2
    assert error_line(result.stderr) == "error: invalid model.lr=-1: must be a number > 0"
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert_untouched(before, fingerprint(workspace))


WINDOW_PAST_THE_BLOCK = ("error: invalid data.seq_len=256: model transformer sees at most 128 tokens "
                         "(model.architecture.block_size); set data.seq_len <= 128 or a larger block_size")


@pytest.mark.slow
def test_train_py_refuses_a_transformer_window_longer_than_its_block(workspace, tiny_corpus):
    """Past its block every position of a transformer runs a block of its own: minutes of silence
    on a CPU. Refused in one line before any work (runs/checks.check_model)."""
    before = fingerprint(workspace)
    tiny = [o for o in TINY if not o.startswith("data.seq_len=")]
    result = run_script(workspace, f"data.path={tiny_corpus}", *tiny, "model=transformer", "data.seq_len=256",
                        "trainer.max_steps=3")
    assert result.returncode == 2
    assert error_line(result.stderr) == WINDOW_PAST_THE_BLOCK
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert "model transformer:" not in result.stdout  # the model summary: no work started
    assert_untouched(before, fingerprint(workspace))


@pytest.mark.parametrize("model", ["transformer", "mlp", "ngram"])
def test_only_a_window_that_costs_more_than_a_token_per_prediction_is_refused(model):
    """At its block the transformer trains; the MLP and the n-gram (a finite context, a token per
    prediction) take any window."""
    validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=128"))
    if model == "transformer":
        with pytest.raises(UserError) as info:
            validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=129"))
        assert str(info.value).startswith("invalid data.seq_len=129: model transformer sees at most 128 tokens")
    else:
        validate(compose_in(Path("/tmp"), f"model={model}", "data.seq_len=4096"))


def test_train_py_unknown_names_get_hydras_message(workspace):
    before = fingerprint(workspace)
    for override, message in [("model=astra_delta", "Could not find 'model/astra_delta'"),
                              ("tokenizer=bpe", "Could not find 'tokenizer/bpe'"),
                              ("logger=neptune", "Could not find 'logger/neptune'")]:
        result = run_script(workspace, override)
        assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert_untouched(before, fingerprint(workspace))


def test_debug_re_raises_instead_of_exiting(monkeypatch):
    for cfg, env in [({"debug": True}, None), ({"debug": False}, "1")]:
        if env:
            monkeypatch.setenv("HYDRA_FULL_ERROR", env)
        with pytest.raises(UserError, match="bad"), job(cfg, report=True):
            raise UserError("bad")
    with pytest.raises(UserError), job(argv=["train.py", "debug=true"], report=True):
        raise UserError("bad")


@pytest.mark.slow
def test_train_py_debug_shows_the_traceback(workspace):
    result = run_script(workspace, "model.lr=-1", "debug=true")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "InvalidSetting: invalid model.lr=-1" in result.stderr


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


@pytest.mark.slow
def test_multirun_job_errors_fail_the_sweep_with_one_line_each(workspace, tiny_corpus):
    result = run_script(workspace, "-m", f"data.path={tiny_corpus}", *TINY, "model.lr=-1,-2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines[:2] == ["error: invalid model.lr=-1: must be a number > 0",
                         "error: invalid model.lr=-2: must be a number > 0"]
    assert lines[-1] == "error: multirun job 0 failed: invalid model.lr=-1: must be a number > 0"


# train.py with the SentencePiece trainer slowed down and every step logged, so the test can
# prove that the two processes overlapped and that only one of them trained.
SLOW_SPM = textwrap.dedent(f"""
    import os, runpy, sys, time
    from gru_experiments.data import corpus as data
    from gru_experiments.data.tokenizers import SentencePieceTokenizer

    def log(event):
        with open(os.environ["SPM_LOG"], "a") as f:
            f.write(f"{{time.time()}} {{os.getpid()}} {{event}}\\n")

    prepared, run_trainer = data.prepared_ids, SentencePieceTokenizer._run_trainer

    def logged_prepared(*args, **kwargs):  # each run asks for the corpus's ids, their tokenizer with them
        log("wants-tokenizer")
        return prepared(*args, **kwargs)

    def slow_trainer(*args, **kwargs):
        log("trains")
        time.sleep(8)  # hold the lock: the other process arrives meanwhile
        return run_trainer(*args, **kwargs)

    data.prepared_ids = logged_prepared
    SentencePieceTokenizer._run_trainer = staticmethod(slow_trainer)
    sys.argv = [{str(TRAIN_PY)!r}, *sys.argv[1:]]
    runpy.run_path({str(TRAIN_PY)!r}, run_name="__main__")
""")


@pytest.mark.slow
def test_runs_started_together_share_one_spm_cache(tmp_path, tiny_corpus):
    """Two train.py processes needing the same, not yet trained SentencePiece model: one trains it (and prepares
    the corpus's ids) while the other waits on the lock, then reads both; the cache holds one valid model."""
    script, log = tmp_path / "slow_spm.py", tmp_path / "spm.log"
    script.write_text(SLOW_SPM)
    args = [f"data.path={tiny_corpus}", *TINY, "tokenizer=spm", "tokenizer.vocab_size=80", "trainer.max_steps=1",
            "model.steps_per_epoch=1"]
    jobs = [start_script(tmp_path, *args, script=script, SPM_LOG=log) for _ in range(2)]
    for process in jobs:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    events = [line.split() for line in log.read_text().splitlines()]
    arrivals = [float(t) for t, _, event in events if event == "wants-tokenizer"]
    trainings = [float(t) for t, _, event in events if event == "trains"]
    assert len(arrivals) == 2 and len(trainings) == 1  # one trained, the other read the cache
    assert max(arrivals) < trainings[0] + 8, "the processes did not overlap; the test proves nothing"

    cache = tmp_path / "data" / "tokenizers"
    models = list(cache.glob("spm-*.model"))
    assert len(models) == 1 and not list(cache.glob("*.tmp"))
    # Both runs used the very model in the cache, and it is a working one.
    tokenizers = [load_checkpoint(p).tokenizer
                  for p in tmp_path.glob("outputs/runs/astra_alpha/*/checkpoints/last.ckpt")]
    assert len(tokenizers) == 2
    assert all(t.model_proto == models[0].read_bytes() for t in tokenizers)
    text = tiny_corpus.read_text()[:2000]
    assert tokenizers[0].vocab_size == 80 and tokenizers[0].decode(tokenizers[0].encode(text)) == text


def test_a_missing_best_checkpoint_leaves_its_figures_out_and_says_so(tmp_path):
    """A run folder copied (or resumed on another machine) without its best checkpoint: the run still ends with
    every other figure, the best checkpoint's left out with a line that names the file."""
    from gru_experiments.runs.scoring import format_best, score_best

    path = tmp_path / "checkpoints" / "best-epoch6-step1750.ckpt"
    best = score_best(None, {"train_steps": 3750, "best_checkpoint": str(path)}, None, None)
    assert best["missing"] and best["step"] is None and best["val_bpc"] is None and best["stateful_bpc"] is None
    assert format_best(best) == f"best checkpoint by val/loss: {path} is missing, so its figures are left out"
