"""Early stopping (issue 51): early_stopping.patience=N stops a run that has stopped improving, its summary says
where and why and still scores the best checkpoint in full; a resume keeps the stopping state; off by default."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from robustness_helpers import TINY, Interrupted, error_line, fingerprint, interrupt_at, run_script

from gru_experiments.errors import UserError
from gru_experiments.runs import training
from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.task import LanguageModelTask
from gru_experiments.runs.training import train

PER_EPOCH, PATIENCE = 50, 2
# The issue's command, on a CPU, with small batches (the text is small), no logger.
RECIPE = [*TINY, "data.batch_size=16", "data.seq_len=64", "model=astra_alpha", f"model.steps_per_epoch={PER_EPOCH}",
          "model.epochs=40", f"early_stopping.patience={PATIENCE}"]


@pytest.fixture(scope="module")
def overfittable(tmp_path_factory) -> Path:
    """4,000 random characters of 18 symbols: nothing to learn beyond their frequencies, and a training split
    that Astra-α memorises within an epoch, so the validation loss is lowest early and then rises."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "random.txt"
    path.write_text("".join(rng.choice("abcdefghijklmnop \n") for _ in range(4000)), encoding="utf-8")
    return path


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def assert_stopped_early(summary: dict) -> None:
    best = summary["early_stopping_best_step"]
    assert summary["stopped_early"] is True
    assert summary["train_steps"] == summary["stopped_at_step"] < 40 * PER_EPOCH
    # patience validations after its best (one a epoch), and the best checkpoint is that validation's
    assert summary["stopped_at_step"] == best + PATIENCE * PER_EPOCH
    assert summary["best"]["step"] == best and not summary["best"]["same_as_final"]
    assert summary["stop_reason"].startswith(f"val/loss did not improve for {PATIENCE} validations in a row")
    assert f"was at step {best}" in summary["stop_reason"]
    assert summary["early_stopping"] == {"monitor": "val/loss", "patience": PATIENCE, "min_delta": 0.0,
                                         "mode": "min"}
    # the best checkpoint evaluated in full, as every run's
    assert summary["best"]["val_bpc"] < summary["val_bpc"]
    assert all(summary["best"][f"{mode}_bpc"] is not None for mode in ("stateful", "stateless", "windowed"))


@pytest.mark.slow
def test_the_issues_command_stops_within_a_few_validations_of_its_best(tmp_path, overfittable):
    done = run_script(tmp_path, *RECIPE, f"data.path={overfittable}", f"paths.output_dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(tmp_path / "run")
    assert_stopped_early(summary)
    assert f"stopped early at step {summary['stopped_at_step']:,}: val/loss did not improve" in done.stdout


def test_off_by_default_and_bad_settings_refused_in_one_line(compose_config, overfittable, tmp_path):
    cfg = compose_config(*TINY)
    assert cfg.early_stopping.patience is None
    summary = train(compose_config(*TINY, f"data.path={overfittable}", "trainer.max_steps=2",
                                   "model.steps_per_epoch=2"))
    assert summary["early_stopping"] is None and summary["stopped_early"] is False
    assert summary["stopped_at_step"] is None and summary["stop_reason"] is None
    # bad values: refused before anything is written, naming the key
    run = tmp_path / "refused"
    for override, match in (("early_stopping.patience=0", "early_stopping.patience"),
                            ("early_stopping.patience=two", "early_stopping.patience"),
                            ("early_stopping.min_delta=-1", "early_stopping.min_delta"),
                            ("early_stopping.mode=lowest", "early_stopping.mode"),
                            ("early_stopping.monitor=train/loss", "early_stopping.monitor"),
                            ("+early_stopping.pateince=3", "unknown key early_stopping.pateince")):
        with pytest.raises(UserError, match=match):
            train(compose_config(*TINY, f"data.path={overfittable}", "early_stopping.patience=2", override,
                                 f"paths.output_dir={run}"))
        assert not run.exists()


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_patience_in_one_line(tmp_path):
    done = run_script(tmp_path, *TINY, "early_stopping.patience=-3")
    assert done.returncode == 2
    assert "early_stopping.patience" in error_line(done.stderr)


def stopping_state(checkpoint: Path) -> dict:
    states = [v for k, v in read_checkpoint(checkpoint)["callbacks"].items() if k.startswith("EarlyStopping")]
    assert len(states) == 1
    return states[0]


@pytest.mark.slow
def test_a_resume_keeps_the_wait_count_and_the_best_score(compose_config, overfittable, tmp_path, monkeypatch):
    """Interrupted one validation after its best (its checkpoint mid-epoch: Lightning writes last.ckpt at an epoch's
    end only where the best improved), the resumed run stops where the uninterrupted one did (a resume that forgot
    the wait count or the best score would stop validations later)."""
    base = [*RECIPE, f"data.path={overfittable}", "checkpoint.every_n_steps=25"]
    whole = train(compose_config(*base, f"paths.output_dir={tmp_path / 'whole'}"))
    assert_stopped_early(whole)
    best = whole["early_stopping_best_step"]

    run = tmp_path / "run"
    interrupt_at(monkeypatch, best + PER_EPOCH + 30)
    with pytest.raises(Interrupted):
        train(compose_config(*base, f"paths.output_dir={run}"))
    monkeypatch.undo()
    state = stopping_state(run / "checkpoints" / "last.ckpt")
    assert state["wait_count"] == 1 and state["best_step"] == best and state["stopped_step"] is None

    resumed = train(compose_config(*base, f"paths.output_dir={run}", f"resume={run}"))
    assert resumed["resumed_from_step"] == best + PER_EPOCH + 25
    for key in ("stopped_early", "stopped_at_step", "stop_reason", "early_stopping_best_step", "train_steps",
                "val_loss"):
        assert resumed[key] == whole[key], key
    assert resumed["best"]["step"] == best


@pytest.mark.slow
def test_a_run_that_stopped_early_resumes_without_training_on(compose_config, overfittable, tmp_path, monkeypatch,
                                                               capsys):
    """Stopped early, then cut off in its evaluation: the resume says so in one line, trains nothing and
    finishes the evaluation; once finished, a resume is refused, saying it stopped early."""
    base = [*RECIPE, f"data.path={overfittable}"]
    run = tmp_path / "run"

    def cut_off(*args, **kwargs):
        raise Interrupted("cut off in the evaluation")

    monkeypatch.setattr(training, "score_run", cut_off)
    with pytest.raises(Interrupted):
        train(compose_config(*base, f"paths.output_dir={run}"))
    monkeypatch.undo()
    state = stopping_state(run / "checkpoints" / "last.ckpt")
    stopped = state["stopped_step"]
    assert stopped is not None and read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == stopped
    capsys.readouterr()

    steps = []
    original = LanguageModelTask.training_step
    monkeypatch.setattr(LanguageModelTask, "training_step",
                        lambda self, batch, i: steps.append(self.global_step) or original(self, batch, i))
    summary = train(compose_config(*base, f"paths.output_dir={run}", f"resume={run}"))
    assert steps == []
    said = [line for line in capsys.readouterr().out.splitlines() if "stopped early at step" in line]
    assert said[0] == (f"{run} stopped early at step {stopped:,} (val/loss did not improve for {PATIENCE} validations "
                       f"in a row (patience {PATIENCE}); its best, {float(state['best_score']):.4f}, was at step "
                       f"{state['best_step']}): not training on; finishing its evaluation")
    assert summary["resumed_from_step"] == stopped
    assert_stopped_early(summary)

    before = fingerprint(run)
    finished = f"already finished \\(it has a summary.json, stopped early at step {stopped}\\)"
    with pytest.raises(UserError, match=finished):
        train(compose_config(*base, f"paths.output_dir={run}", f"resume={run}"))
    assert fingerprint(run) == before
