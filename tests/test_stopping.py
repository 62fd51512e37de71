"""Early stopping (runs/stopping.py, issue 51): early_stopping.patience=N stops a run that has stopped improving, its
summary says where and why and still scores the best checkpoint in full; a resume keeps the stopping state; off by
default (these trainings are slow-marked). Without a training: the callback driven through Lightning's own check by a
stand-in trainer, its state through a checkpoint, the summary's record and the callback built from the spec's
settings."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from robustness_helpers import TINY, Interrupted, error_line, fingerprint, interrupt_at, run_script, train

from gru_experiments.errors import UserError
from gru_experiments.runs import training
from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.stopping import (
    EarlyStopping,
    build_early_stopping,
    check_settings,
    stop_description,
    stopped_state,
    stopping_summary,
)
from gru_experiments.runs.task import LanguageModelTask

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


# --- the callback without a training: a stand-in trainer ---------------------------------------------------------

SETTINGS = {"_target_": "gru_experiments.runs.stopping.EarlyStopping", "monitor": "val/loss", "patience": 2,
            "min_delta": 0.0, "mode": "min"}


def validate(callback: EarlyStopping, trainer, step: int, loss: float) -> None:
    """One validation's end at training step `step` with val/loss `loss`, as Lightning calls the check."""
    trainer.global_step, trainer.callback_metrics = step, {"val/loss": torch.tensor(loss)}
    callback._run_early_stopping_check(trainer)


def stand_in_trainer():
    return SimpleNamespace(should_stop=False, global_step=0, current_epoch=0, fast_dev_run=False,
                           callback_metrics={}, is_global_zero=True, world_size=1, sanity_checking=False,
                           strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all=True: decision))


def test_the_callback_records_its_best_and_its_stop_by_training_step():
    callback, trainer = build_early_stopping(SETTINGS), stand_in_trainer()
    assert isinstance(callback, EarlyStopping) and not callback.stopped and callback.reason() is None
    for step, loss in ((200, 3.0), (400, 2.5), (600, 2.6)):
        validate(callback, trainer, step, loss)
        assert not trainer.should_stop
    assert callback.best_step == 400 and callback.stopped_step is None
    validate(callback, trainer, 800, 2.7)  # a second validation in a row without improvement: patience 2 spent
    assert trainer.should_stop and callback.stopped and callback.stopped_step == 800 and callback.best_step == 400
    assert callback.reason() == ("val/loss did not improve for 2 validations in a row (patience 2); its best, 2.5000, "
                                 "was at step 400")
    record = stopping_summary(SETTINGS, callback)
    assert record == {"early_stopping": {"monitor": "val/loss", "patience": 2, "min_delta": 0.0, "mode": "min"},
                      "stopped_early": True, "stopped_at_step": 800, "stop_reason": callback.reason(),
                      "early_stopping_best_step": 400}

    # Its state travels in a checkpoint: a resumed callback knows its best and its stop, and the checkpoint says so.
    state = callback.state_dict()
    resumed = build_early_stopping(SETTINGS)
    resumed.load_state_dict(state)
    assert (resumed.best_step, resumed.stopped_step, resumed.wait_count) == (400, 800, 2) and resumed.stopped
    assert stopped_state({"callbacks": {"EarlyStopping{'monitor': 'val/loss'}": state}}) == state
    assert stop_description(state) == callback.reason()


def test_a_resume_counts_on_under_its_own_patience():
    """resume=RUN early_stopping.patience=4: the wait count goes on from the checkpoint, the patience is the
    command's (Lightning would restore the saved one and ignore the command)."""
    callback, trainer = build_early_stopping(SETTINGS), stand_in_trainer()
    for step, loss in ((200, 3.0), (400, 3.1)):
        validate(callback, trainer, step, loss)
    resumed, trainer = build_early_stopping(SETTINGS | {"patience": 4}), stand_in_trainer()
    resumed.load_state_dict(callback.state_dict())
    assert (resumed.patience, resumed.wait_count, resumed.best_step) == (4, 1, 200)
    for step in (600, 800):
        validate(resumed, trainer, step, 3.2)
        assert not trainer.should_stop  # patience 2, saved in the checkpoint, would have stopped at 600
    validate(resumed, trainer, 1000, 3.2)
    assert trainer.should_stop and resumed.stopped_step == 1000


def test_a_run_that_never_stopped_and_a_model_without_the_callback():
    callback, trainer = build_early_stopping(SETTINGS), stand_in_trainer()
    validate(callback, trainer, 200, 3.0)
    assert stopped_state({"callbacks": {"EarlyStopping": callback.state_dict()}}) is None
    assert stopped_state({}) is None
    assert stopping_summary(SETTINGS, callback) == {
        "early_stopping": {"monitor": "val/loss", "patience": 2, "min_delta": 0.0, "mode": "min"},
        "stopped_early": False, "stopped_at_step": None, "stop_reason": None, "early_stopping_best_step": 200}
    assert stopping_summary(None, None)["early_stopping"] is None  # off, or a counted model
    assert build_early_stopping(None) is None


def test_a_key_the_callback_does_not_take_is_one_line():
    with pytest.raises(UserError, match=r"^early_stopping: .*bogus.* \(conf/early_stopping/default.yaml lists"):
        build_early_stopping(SETTINGS | {"bogus": 1})


@pytest.mark.parametrize("override, message", [
    ("early_stopping.mode=max", "early_stopping.mode=max with early_stopping.monitor=val/loss: a loss improves as it "
                                "falls"),
    ("+early_stopping.check_on_train_epoch_end=abc", "invalid early_stopping.check_on_train_epoch_end='abc': must be "
                                                     "false"),
    ("+early_stopping.check_on_train_epoch_end=true", "invalid early_stopping.check_on_train_epoch_end=True"),
    ("+early_stopping.divergence_threshold=abc", "invalid early_stopping.divergence_threshold='abc': must be null "
                                                 "(off) or a number"),
    ("+early_stopping.verbose=maybe", "invalid early_stopping.verbose='maybe': must be true or false"),
    ("+early_stopping.pateince=3", "unknown key early_stopping.pateince: early_stopping (Lightning's EarlyStopping) "
                                   "takes _target_, monitor, min_delta, patience"),
])
def test_early_stopping_keys_are_checked_before_any_work(compose_config, override, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_settings(compose_config(*TINY, "early_stopping.patience=2", override))


def test_early_stopping_settings_without_patience_say_they_do_nothing(compose_config, capsys):
    check_settings(compose_config(*TINY, "early_stopping.min_delta=0.1", "+early_stopping.stopping_threshold=1.5"))
    assert capsys.readouterr().out.strip() == (
        "early_stopping.min_delta=0.1, early_stopping.stopping_threshold=1.5 have no effect: early stopping is off "
        "(early_stopping.patience=null); early_stopping.patience=N turns it on")
    check_settings(compose_config(*TINY, "early_stopping.patience=2", "early_stopping.min_delta=0.1"))
    check_settings(compose_config(*TINY))  # the defaults: nothing to say
    assert capsys.readouterr().out == ""
