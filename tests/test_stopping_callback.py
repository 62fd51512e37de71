"""runs/stopping.py without a training (the trainings are test_early_stopping.py's, marked slow): the callback
driven through Lightning's own check by a stand-in trainer, its state through a checkpoint, the summary's record
and the callback built from the spec's settings."""

from types import SimpleNamespace

import pytest
import torch

from gru_experiments.errors import UserError
from gru_experiments.runs.stopping import (
    EarlyStopping,
    build_early_stopping,
    stop_description,
    stopped_state,
    stopping_summary,
)

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
