"""An interrupted run resumes from its last checkpoint and ends exactly where an uninterrupted
run ends: same number of steps, same losses, same weights."""

from __future__ import annotations

import json
import math
import re
import signal
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from robustness_helpers import (
    TINY,
    TRAIN_PY,
    Interrupted,
    assert_untouched,
    error_line,
    fingerprint,
    interrupt_at,
    run_killed_after_checkpoint,
    run_script,
    train,
)
from wandb_records import offline_runs

from gru_experiments.errors import UserError
from gru_experiments.runs.checkpoints import read_checkpoint, wandb_run_id
from gru_experiments.runs.task import LanguageModelTask

# 2 epochs of 8 steps, last.ckpt every 3 steps (and at epoch ends); the interruption comes at
# step 11, two steps after the mid-epoch checkpoint of step 9, so the resumed run redoes 10 and 11.
RECIPE = [*TINY, "data.seq_len=16", "model.steps_per_epoch=8", "model.epochs=2", "checkpoint.every_n_steps=3"]
TOTAL_STEPS, KILL_AT, SAVED_AT = 16, 11, 9


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def weights_of(run: Path) -> dict:
    return read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"]


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    a, b = summary_of(resumed), summary_of(uninterrupted)
    assert a["train_steps"] == b["train_steps"] == TOTAL_STEPS
    assert a["resumed_from_step"] == SAVED_AT and b["resumed_from_step"] is None
    # Same batches, same dropout masks, same optimizer and schedule: the same numbers.
    for key in ("train_loss", "val_loss", "val_bpc"):
        assert a[key] == b[key], key
    wa, wb = weights_of(resumed), weights_of(uninterrupted)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(torch.isfinite(t).all() for t in wa.values())
    assert a["val_loss"] < 3.8  # it learned something (a uniform guess is ln(54) = 4.0)


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_uninterrupted_result(compose_config, tiny_corpus, tmp_path, monkeypatch):
    base = [*RECIPE, f"data.path={tiny_corpus}"]
    uninterrupted = tmp_path / "uninterrupted"
    train(compose_config(*base, f"paths.output_dir={uninterrupted}"))

    run = tmp_path / "run"  # compose_config's output folder
    interrupt_at(monkeypatch, KILL_AT)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == SAVED_AT
    assert not (run / "summary.json").exists()
    monkeypatch.undo()

    # A step limit at or below the checkpoint's step would train nothing and mark the run finished: refused,
    # naming both steps, the run untouched (and resumable below).
    before = fingerprint(run)
    for limit in (SAVED_AT - 4, SAVED_AT):
        with pytest.raises(UserError, match=f"is at step {SAVED_AT}, but this resume would stop training at step "
                                            f"{limit} .* its own limit is step {TOTAL_STEPS}; resume with a step "
                                            f"limit above {SAVED_AT}, or without one"):
            train(compose_config(*base, f"resume={run}", f"trainer.max_steps={limit}"))
    with pytest.raises(UserError, match=f"is at step {SAVED_AT}, but this resume would stop training at step 8 "):
        train(compose_config(*base, f"resume={run}", "model.epochs=1"))  # the recipe's limit: 1 x 8 steps
    assert fingerprint(run) == before

    steps = []  # a resume that silently started over would also end with the same numbers
    original = LanguageModelTask.training_step
    monkeypatch.setattr(LanguageModelTask, "training_step",
                        lambda self, batch, i: steps.append(self.global_step) or original(self, batch, i))
    summary = train(compose_config(*base, f"resume={run}"))
    assert steps == list(range(SAVED_AT, TOTAL_STEPS))
    assert summary["run_dir"] == str(run)
    assert_same_run(run, uninterrupted)


# Issue 62: a checkpoint written at an epoch's end (checkpoint.every_n_steps=0, or a kill between that checkpoint and
# the next step's) resumes as exactly as one written mid-epoch, with trainer.max_steps too (Lightning restarted the
# finished epoch under max_steps and counted it twice: the run stopped one epoch short, with another loss).
# 3 epochs of 4 steps; (every_n_steps, the step the run is cut off after, the step of its last.ckpt).
CUTS = ((0, 5, 4), (3, 8, 6))  # an epoch's end; mid-epoch


@pytest.mark.parametrize("max_steps", [None, 12, 10])
def test_a_resume_from_an_epoch_end_or_a_mid_epoch_checkpoint_is_exact(compose_config, tiny_corpus, tmp_path,
                                                                       monkeypatch, max_steps):
    base = [*TINY, f"data.path={tiny_corpus}", "data.seq_len=16", "model.steps_per_epoch=4", "model.epochs=3",
            *([f"trainer.max_steps={max_steps}"] if max_steps else [])]
    reference = train(compose_config(*base, f"paths.output_dir={tmp_path / 'reference'}"))
    assert reference["train_steps"] == (max_steps or 12)
    for every, cut, saved in CUTS:
        run = tmp_path / f"cut{cut}"
        config = [*base, f"checkpoint.every_n_steps={every}", f"paths.output_dir={run}"]
        interrupt_at(monkeypatch, cut)
        with pytest.raises(Interrupted):
            train(compose_config(*config))
        monkeypatch.undo()
        assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == saved
        summary = train(compose_config(*config, f"resume={run}"))
        assert (summary["resumed_from_step"], summary["train_steps"]) == (saved, reference["train_steps"])
        assert [summary[key] for key in ("train_loss", "val_loss", "val_bpc")] == \
            [reference[key] for key in ("train_loss", "val_loss", "val_bpc")], (every, cut)


# history.csv across a resume: 2 epochs of 8 steps, last.ckpt every 4 steps, the mean train/loss every 3 steps. Cut off
# after step 6 (the resume restarts from step 4: rows 5 and 6 come again, and the mean at step 6 spans the cut), or in
# the evaluation after the last step (training done: the resume trains nothing); and a counted model cut off in its
# evaluation (its resume counts and validates again, at step 0, where history.csv has its validation already).
HISTORY_RECIPE = [*TINY, "data.seq_len=16", "model.steps_per_epoch=8", "model.epochs=2", "checkpoint.every_n_steps=4",
                  "trainer.log_every_n_steps=3"]
COUNTED = [*TINY, "data.seq_len=16", "model=ngram2"]
HISTORY_CUTS = {"training": (HISTORY_RECIPE, 4), "evaluation": (HISTORY_RECIPE, 16), "counted": (COUNTED, 0)}


def history_rows(run: Path) -> list[tuple[int, str, float]]:
    rows = [line.split(",") for line in (run / "history.csv").read_text().splitlines()]
    assert rows[0] == ["step", "epoch", "metric", "value"]
    return [(int(step), metric, float(value)) for step, _, metric, value in rows[1:]]


@pytest.mark.parametrize("cut", HISTORY_CUTS)
def test_a_resumed_runs_history_is_the_uninterrupted_runs(compose_config, tiny_corpus, tmp_path, monkeypatch, cut):
    recipe, saved = HISTORY_CUTS[cut]
    base = [*recipe, f"data.path={tiny_corpus}"]
    uninterrupted = tmp_path / "uninterrupted"
    train(compose_config(*base, f"paths.output_dir={uninterrupted}"))
    expected = history_rows(uninterrupted)
    assert [row[0] for row in expected if row[1] == "train/loss"] == ([] if saved == 0 else [3, 6, 9, 12, 15, 16])

    run = tmp_path / "run"  # compose_config's output folder
    if cut == "training":
        interrupt_at(monkeypatch, 6)
    else:
        monkeypatch.setattr("gru_experiments.runs.training.score_run", lambda *a, **k: (_ for _ in ()).throw(
            Interrupted("interrupted in the evaluation")))
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    monkeypatch.undo()
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == saved
    train(compose_config(*base, f"resume={run}"))

    resumed = history_rows(run)
    keys = [(step, metric) for step, metric, _ in resumed]
    assert len(keys) == len(set(keys)), f"duplicate (step, metric) rows: {keys}"
    assert keys == [(step, metric) for step, metric, _ in expected]
    assert all(a[2] == pytest.approx(b[2], rel=1e-6, abs=1e-6) for a, b in zip(resumed, expected)), (resumed, expected)


def test_history_is_cut_back_to_the_checkpoints_step(tmp_path):
    """loggers.keep_history_until: the rows at or before the step, a row a kill cut short dropped; the metrics kept
    at the step."""
    from gru_experiments.runs.loggers import keep_history_until

    path = tmp_path / "history.csv"
    assert keep_history_until(path, 4) == set() and not path.exists()
    path.write_bytes(b"step,epoch,metric,value\r\n3,0,train/loss,3.6\r\n4,0,val/loss,nan\r\n6,0,train/loss,2.7\r\n"
                     b"4,1,val/bpc,2.")  # the last row cut short by a kill
    assert keep_history_until(path, 4) == {"val/loss"}
    assert path.read_bytes() == b"step,epoch,metric,value\r\n3,0,train/loss,3.6\r\n4,0,val/loss,nan\r\n"

def test_resume_restores_the_wandb_run(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """The run id is stored in the checkpoint and the resumed run logs to the same W&B run
    (offline here: both offline run folders carry the same id)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    base = [*TINY, f"data.path={tiny_corpus}", "logger=wandb", "model.steps_per_epoch=6", "model.epochs=1",
            "checkpoint.every_n_steps=2"]
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    run_id = wandb_run_id(read_checkpoint(run / "checkpoints" / "last.ckpt"))
    assert run_id
    monkeypatch.undo()
    monkeypatch.setenv("WANDB_MODE", "offline")
    train(compose_config(*base, f"resume={run}"))
    # Two offline folders (one per process), one run id. (A folder's name gets a -1 suffix when
    # both start within the same second, so read the id from the run file itself.)
    runs = offline_runs(run)
    assert len(runs) == 2 and all(r.run_id == run_id for r in runs)
    assert wandb_run_id(read_checkpoint(run / "checkpoints" / "last.ckpt")) == run_id


def test_resume_errors(compose_config, tiny_corpus, tmp_path, monkeypatch):
    base = [*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=4", "model.epochs=1",
            "checkpoint.every_n_steps=2"]  # compose_config puts paths.log_dir at tmp_path/outputs
    with pytest.raises(UserError, match="no astra_alpha run with a checkpoint"):
        train(compose_config(*base, "resume=last"))
    with pytest.raises(UserError, match="no such run folder"):
        train(compose_config(*base, f"resume={tmp_path / 'nope'}"))

    # An interrupted run, then requests that do not fit it.
    run = tmp_path / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000"
    interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted):
        train(compose_config(*base, f"paths.output_dir={run}"))
    monkeypatch.undo()
    before = fingerprint(run)
    with pytest.raises(UserError, match="was trained with a char tokenizer .* but this config builds an spm"):
        train(compose_config(*base, "resume=last", "tokenizer=spm", "tokenizer.vocab_size=60"))
    with pytest.raises(UserError, match="holds a model with architecture"):
        train(compose_config(*base, "resume=last", "model.architecture.hidden_size=64"))
    # Each pinned key named with its two values; the first that differs.
    for override, saved, asked in (("model.lr=3e-3", "model.lr=0.01", "model.lr=0.003"),
                                   ("optim=transformer", "optim.name='original'", "optim.name='transformer'"),
                                   ("optim.warmup_steps=10", "optim.warmup_steps=0", "optim.warmup_steps=10"),
                                   ("optim.betas=[0.9,0.99]", "optim.betas=[0.9, 0.999]", "optim.betas=[0.9, 0.99]")):
        differs = f"{saved}, but this config asks for {asked}"
        with pytest.raises(UserError, match=re.escape(f"was trained with {differs}; a run resumes with its own "
                                                      "learning rate and recipe: leave model.lr and optim out")):
            train(compose_config(*base, "resume=last", override))
    with pytest.raises(UserError, match="resume takes a run folder"):
        train(compose_config(*base, f"resume={run / 'checkpoints' / 'last.ckpt'}"))
    assert fingerprint(run) == before

    (run / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(UserError, match="has no checkpoints/last.ckpt: it stopped before its first checkpoint"):
        train(compose_config(*base, f"resume={run}"))
    (tmp_path / "notes").mkdir()
    with pytest.raises(UserError, match=r"is not a run folder \(it has neither checkpoints/ nor .hydra/\)"):
        train(compose_config(*base, f"resume={tmp_path / 'notes'}"))


def test_resume_of_a_finished_run_is_refused(compose_config, tiny_corpus, tmp_path):
    base = [*TINY, f"data.path={tiny_corpus}", "trainer.max_steps=2", "model.steps_per_epoch=2"]
    train(compose_config(*base))
    with pytest.raises(UserError, match="already finished"):
        train(compose_config(*base, f"resume={tmp_path / 'run'}"))


# A real process, killed with SIGKILL (no cleanup, no finally) right after step KILL_AT.
KILLER = textwrap.dedent(f"""
    import os, runpy, signal, sys
    from gru_experiments.runs.task import LanguageModelTask

    original = LanguageModelTask.on_train_batch_end

    def on_train_batch_end(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == {KILL_AT}:
            os.kill(os.getpid(), signal.SIGKILL)

    LanguageModelTask.on_train_batch_end = on_train_batch_end
    sys.argv = [{str(TRAIN_PY)!r}, *sys.argv[1:]]
    runpy.run_path({str(TRAIN_PY)!r}, run_name="__main__")
""")


@pytest.mark.slow
def test_sigkilled_train_py_resumes_with_resume_last(tmp_path, tiny_corpus):
    base = [*RECIPE, f"data.path={tiny_corpus}", "logger=csv"]
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)

    reference = tmp_path / "reference"
    assert run_script(reference, *base).returncode == 0
    (uninterrupted,) = (reference / "outputs" / "runs" / "astra_alpha").iterdir()

    root = tmp_path / "root"
    killed = run_script(root, *base, script=killer)
    assert killed.returncode == -signal.SIGKILL
    (run,) = (root / "outputs" / "runs" / "astra_alpha").iterdir()
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == SAVED_AT
    first_metrics = (run / "csv" / "metrics.csv").read_bytes()

    # Only the model is named (the config's default); everything else comes from the run itself.
    # ckpt_path=last is Lightning's spelling of resume=last.
    resumed = run_script(root, "ckpt_path=last", "trainer.enable_progress_bar=false")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run}" in resumed.stdout
    assert list((root / "outputs" / "runs" / "astra_alpha").iterdir()) == [run]  # no new run folder
    assert_same_run(run, uninterrupted)
    # The first part's records are kept: its metrics and its .hydra config.
    assert (run / "csv" / "metrics.csv").read_bytes() == first_metrics
    resumed_metrics = (run / "csv" / f"resumed_step{SAVED_AT}" / "metrics.csv").read_text().splitlines()
    step_column = resumed_metrics[0].split(",").index("step")
    assert min(int(row.split(",")[step_column]) for row in resumed_metrics[1:]) >= SAVED_AT
    assert (run / ".hydra" / "config.yaml").is_file() and list((run / ".hydra").glob("resumed_*/config.yaml"))

    again = run_script(root, "resume=last")
    assert again.returncode == 2 and "already finished" in error_line(again.stderr)


# Every figure survives a resume (issue 25): a run killed with SIGKILL right after a checkpoint and
# resumed ends with the uninterrupted run's summary.json. 2 epochs of 4 steps, last.ckpt every 2
# steps. The run is killed right after the checkpoint of each step in KILLS, and resumed: 4 (the
# end of epoch 0), 6 (the middle of the last epoch: the resumed run trains on within the epoch
# whose loss sums the checkpoint carries) and 8 (after the last step: the kill comes in the
# end-of-run evaluation, and the resumed run trains no more). About 20 s a training mode.
RESUMED_RECIPE = ["data.seq_len=16", "model.steps_per_epoch=4", "model.epochs=2", "checkpoint.every_n_steps=2"]
KILLS = (4, 6, 8)
TIMES = ("seconds", "per_second")  # keys of figures measured in seconds, or derived from them


def figure_differences(resumed, uninterrupted, where: str = "summary") -> list[str]:
    """Where two summaries differ, recursively, exactly (nan equals nan), but for the times and
    the resume's own record; each summary's run folder reads <run> in its paths."""
    if isinstance(resumed, dict) and isinstance(uninterrupted, dict):
        keys = [k for k in {**resumed, **uninterrupted}
                if k != "resumed_from_step" and not any(t in k for t in TIMES)]
        return [d for k in keys for d in figure_differences(resumed.get(k, "<missing>"),
                                                            uninterrupted.get(k, "<missing>"), f"{where}.{k}")]
    if isinstance(resumed, list) and isinstance(uninterrupted, list) and len(resumed) == len(uninterrupted):
        return [d for i, (a, b) in enumerate(zip(resumed, uninterrupted))
                for d in figure_differences(a, b, f"{where}[{i}]")]
    if resumed == uninterrupted or all(isinstance(v, float) and math.isnan(v) for v in (resumed, uninterrupted)):
        return []
    return [f"{where}: {resumed!r} resumed, {uninterrupted!r} uninterrupted"]


def summary_in_run_terms(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text().replace(json.dumps(str(run))[1:-1], "<run>"))


@pytest.mark.parametrize("mode", ["windows", "streams"])
@pytest.mark.slow
def test_every_figure_survives_sigkill_and_resume(tmp_path, tiny_corpus, mode):
    base = [*TINY, f"data.path={tiny_corpus}", f"training={mode}", *RESUMED_RECIPE]
    assert run_script(tmp_path / "reference", *base).returncode == 0
    (uninterrupted,) = (tmp_path / "reference" / "outputs" / "runs" / "astra_alpha").iterdir()

    root, run = tmp_path / "root", None
    for step in KILLS:
        killed = run_killed_after_checkpoint(root, step, *(base if run is None else [f"resume={run}"]))
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (run,) = (root / "outputs" / "runs" / "astra_alpha").iterdir()
        assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == step
        assert not (run / "summary.json").exists()
    resumed = run_script(root, f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr

    summary = summary_in_run_terms(run)
    assert summary["resumed_from_step"] == KILLS[-1] and summary["train_steps"] == 8
    assert figure_differences(summary, summary_in_run_terms(uninterrupted)) == []


def test_figure_differences():
    nan = float("nan")
    a = {"train_loss": 1.0, "best": {"val_bpc": 2.0, "curve": [1, nan]}, "wall_seconds": 3.0,
         "tokens_per_second": 9.0, "resumed_from_step": 4}
    assert figure_differences(a, {**a, "wall_seconds": 5.0, "tokens_per_second": 1.0, "resumed_from_step": None}) == []
    assert figure_differences({**a, "best": {"val_bpc": 2.0, "curve": [1, 1.0]}}, a) == [
        "summary.best.curve[1]: 1.0 resumed, nan uninterrupted"]
    assert figure_differences({**a, "new_figure": 1}, a) == ["summary.new_figure: 1 resumed, '<missing>' uninterrupted"]
    assert figure_differences({**a, "train_loss": nan}, a) == ["summary.train_loss: nan resumed, 1.0 uninterrupted"]


@pytest.mark.slow
def test_train_py_failed_resume_keeps_the_run(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """A refused resume changes nothing in the run folder: Hydra records nothing there, and train() refuses before
    this attempt's config record is written (run_dir.RunDir.record_config)."""
    root = tmp_path / "root"
    run = root / "outputs" / "runs" / "astra_alpha" / "2000-01-01_00-00-00_000000"
    base = [*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=4", "model.epochs=1",
            "checkpoint.every_n_steps=2"]
    interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted):
        train(compose_config(*base, f"paths.output_dir={run}"))
    monkeypatch.undo()
    (run / ".hydra").mkdir()  # the run's saved config, as train.py records it
    OmegaConf.save(compose_config(*base, f"paths.output_dir={run}"), run / ".hydra" / "config.yaml")
    before = fingerprint(run)
    for overrides, refused in (
            (["tokenizer=spm", "tokenizer.vocab_size=60"],
             "was trained with a char tokenizer (54 characters), but this config builds an spm tokenizer"),
            (["model.lr=0.5"], "was trained with model.lr=0.01, but this config asks for model.lr=0.5"),
            (["optim.warmup_steps=10"], "optim.warmup_steps=0, but this config asks for optim.warmup_steps=10"),
            (["trainer.max_steps=2"], "is at step 2, but this resume would stop training at step 2")):
        result = run_script(root, f"resume={run}", *overrides)
        assert result.returncode == 2 and refused in error_line(result.stderr)
        assert_untouched(before, fingerprint(run))  # not even this attempt's .hydra/resumed_<time>/


def test_a_resume_composes_the_runs_saved_config_with_the_commands_overrides(compose_config):
    """resume.resumed_config: the run's own learning rate and recipe (its model config may have changed them since),
    the command's overrides at their composed values, today's default for a key the run's config lacks, and a
    one-line refusal for what a resume cannot change (item 8 of issue 43: the probe's keys and schedule)."""
    from gru_experiments.runs.resume import resumed_config

    saved = compose_config(*TINY, "probe=recall", "model.lr=0.02", "optim=transformer", "logger=wandb")
    del saved.training.recall_weight  # a run from before the key
    overrides = ["resume=RUN", "logger=csv", "trainer.max_steps=50", "model.epochs=3"]
    chosen = {"probe": "recall", "training": "windows", "logger": "wandb", "model": "astra_alpha"}
    cfg = resumed_config(saved, compose_config(*overrides), overrides, chosen, {**chosen, "probe": "none"})
    assert (cfg.model.lr, cfg.optim.name, cfg.model.architecture) == (0.02, "transformer", saved.model.architecture)
    assert (cfg.logger.name, cfg.trainer.max_steps, cfg.model.epochs, cfg.resume) == ("csv", 50, 3, "RUN")
    assert cfg.probe == saved.probe and cfg.training.recall_weight == 1  # the run's option: today's new key
    # another option of a group than the run's: the run's keys alone (no wandb keys in a run logged to none)
    assert resumed_config(compose_config(*TINY), compose_config("logger=wandb"), ["resume=RUN"], {"logger": "none"},
                          {"logger": "wandb"}).logger == compose_config(*TINY).logger
    for override, refused in (("probe.keys=8", "was trained with probe.keys=16, but this command asks for "
                                               "probe.keys=8; a resume continues the run as it was"),
                              ("probe.phases=[{start:0,distances:[4],gap:2}]", "asks for probe.phases=[{'start': 0"),
                              ("training=streams", "was trained with training={'batching': 'windows'}"),
                              ("seed=7", "was trained with seed=1234"),
                              ("experiment=recall_alpha_streams", "experiment= changes no one key")):
        with pytest.raises(UserError, match=re.escape(refused)):
            resumed_config(saved, compose_config(*TINY, "probe=recall", override), ["resume=RUN", override])
    # the same value as the run's is no change, and the group the run chose keeps the run's keys
    saved.probe.keys = 8
    overrides = ["resume=RUN", "probe=recall", "seed=1234"]
    same = resumed_config(saved, compose_config(*overrides[1:]), overrides, *[{"probe": "recall"}] * 2)
    assert same.probe == saved.probe


@pytest.mark.parametrize("override", ["early_stopping.monitor=val/bpc", "early_stopping.mode=max"])
def test_a_resume_that_changes_what_early_stopping_watches_is_refused(compose_config, override):
    """Lightning files the stopper's state under its monitor and mode: another of either dropped it silently."""
    from gru_experiments.runs.resume import resumed_config

    saved = compose_config(*TINY, "early_stopping.patience=2")
    key = override.split("=")[0]
    with pytest.raises(UserError, match=f"was trained with {key}='(val/loss|min)', but this command asks for {key}="):
        resumed_config(saved, compose_config(*TINY, "early_stopping.patience=2", override), ["resume=RUN", override])
