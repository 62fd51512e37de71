"""Early stopping (conf/early_stopping/): Lightning's, recording the steps of its best score and of its stop."""

from __future__ import annotations

import inspect

from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from gru_experiments.errors import UserError
from gru_experiments.validation import MISSING, Rule, check_rules, int_at_least, is_number, non_negative_number, select

NOT_STOPPED = EarlyStoppingReason.NOT_STOPPED.value
LOSSES = ("val/loss", "val/bpc")  # what it may monitor: each a loss, lower is better


class EarlyStopping(LightningEarlyStopping):
    """Lightning's, checked after each validation (before the checkpoints of that validation are written, so that
    they hold the stop), recording `best_step` and `stopped_step` (training steps)."""

    def __init__(self, monitor: str = "val/loss", patience: int = 3, min_delta: float = 0.0, mode: str = "min",
                 **kwargs):
        kwargs.setdefault("check_on_train_epoch_end", False)
        super().__init__(monitor=monitor, patience=patience, min_delta=min_delta, mode=mode, **kwargs)
        self.best_step: int | None = None
        self.stopped_step: int | None = None
        self._step = 0

    def _run_early_stopping_check(self, trainer) -> None:
        self._step = trainer.global_step
        super()._run_early_stopping_check(trainer)
        if trainer.should_stop and self.stopped_step is None:
            self.stopped_step = trainer.global_step

    def _evaluate_stopping_criteria(self, current):
        should_stop, reason = super()._evaluate_stopping_criteria(current)
        if self.wait_count == 0 and not should_stop:  # an improvement
            self.best_step = self._step
        return should_stop, reason

    def state_dict(self) -> dict:
        return super().state_dict() | {"best_step": self.best_step, "stopped_step": self.stopped_step,
                                       "monitor": self.monitor, "min_delta": abs(self.min_delta)}

    def load_state_dict(self, state_dict: dict) -> None:
        patience = self.patience  # the resume's own (early_stopping.patience=N), where Lightning restores the saved
        super().load_state_dict(state_dict)
        self.patience = patience
        self.best_step, self.stopped_step = state_dict.get("best_step"), state_dict.get("stopped_step")

    @property
    def stopped(self) -> bool:
        return self.stopping_reason != EarlyStoppingReason.NOT_STOPPED

    def reason(self) -> str | None:
        """Why it stopped, in a sentence; None while it has not."""
        return stop_description(self.state_dict()) if self.stopped else None


# Every key of the group, checked before any work (a wrong value would otherwise fail, or silently do nothing, at
# the first validation): the four conf/early_stopping/default.yaml sets, and Lightning's that pass through to it.
RULES = [
    Rule("patience", int_at_least(1),
         "null (off) or an integer >= 1 (validations in a row without improvement before training stops)",
         optional=True),
    Rule("min_delta", non_negative_number, "a number >= 0", may_be_absent=True),
    Rule("monitor", lambda v: v in LOSSES, " or ".join(LOSSES), may_be_absent=True),
    Rule("mode", lambda v: v in ("min", "max"), "min or max", may_be_absent=True),
    *(Rule(key, lambda v: isinstance(v, bool), "true or false", may_be_absent=True)
      for key in ("verbose", "strict", "check_finite", "log_rank_zero_only")),
    *(Rule(key, is_number, "null (off) or a number, in the monitored metric's units", optional=True)
      for key in ("stopping_threshold", "divergence_threshold")),
    Rule("check_on_train_epoch_end", lambda v: v is False,
         "false (the check runs at each validation's end, before that validation's checkpoints are written, so that "
         "they hold the stop; true or null would check at the training epoch's end, after them)", may_be_absent=True),
]


def defaults() -> dict:
    """Each key the callback takes, with its default (ours, else Lightning's)."""
    parameters = {**inspect.signature(LightningEarlyStopping.__init__).parameters,
                  **inspect.signature(EarlyStopping.__init__).parameters}
    return {name: parameter.default for name, parameter in parameters.items() if name not in ("self", "kwargs")}


def check_settings(cfg) -> None:
    """The early_stopping group before any work: each key's value, mode against the monitored loss, and a line for
    settings that do nothing while early stopping is off (patience null). A config from before the group: nothing."""
    group = select(cfg, "early_stopping")
    if group is MISSING or group is None:
        return
    default = defaults()
    check_rules(group, RULES, "early_stopping.", known=["_target_", *default],
                owner="early_stopping (Lightning's EarlyStopping)")
    monitor, mode = group.get("monitor", "val/loss"), group.get("mode", "min")
    if mode == "max":
        raise UserError(f"early_stopping.mode=max with early_stopping.monitor={monitor}: a loss improves as it falls, "
                        "so max would take each improvement for a step back and stop a run that is learning; leave "
                        "early_stopping.mode=min")
    if group.get("patience") is None:
        unused = [f"early_stopping.{key}={value}" for key, value in group.items()
                  if key not in ("_target_", "patience", "check_on_train_epoch_end") and value != default.get(key)]
        if unused:
            print(f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect: early stopping is off "
                  "(early_stopping.patience=null); early_stopping.patience=N turns it on")


def build_early_stopping(settings: dict | None) -> EarlyStopping | None:
    """The callback of the group's `settings` (None: off, no callback); a key its class does not take: UserError."""
    if settings is None:
        return None
    try:
        return instantiate(settings)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the class's TypeError
        reason = str(err.__cause__ or err).splitlines()[0]
        raise UserError(f"early_stopping: {reason} (conf/early_stopping/default.yaml lists the keys)") from None


def stopping_summary(settings: dict | None, callback: EarlyStopping | None) -> dict:
    """summary.json's record of early stopping: its settings, whether, where and why it stopped, its best step."""
    stopped = callback is not None and callback.stopped
    return {
        "early_stopping": ({key: value for key, value in settings.items() if key != "_target_"}
                           if callback is not None else None),  # a counted model: never stopped
        "stopped_early": stopped,
        "stopped_at_step": callback.stopped_step if stopped else None,
        "stop_reason": callback.reason() if stopped else None,
        "early_stopping_best_step": callback.best_step if callback is not None else None,
    }


def stop_description(state: dict) -> str:
    """Why a stopped EarlyStopping (its state: the callback's own, or a checkpoint's) stopped, in a sentence."""
    if state.get("stopping_reason") != EarlyStoppingReason.PATIENCE_EXHAUSTED.value:
        return str(state.get("stopping_reason_message"))
    by = f" by more than {state['min_delta']:g}" if state.get("min_delta") else ""
    step = state.get("best_step")
    return (f"{state.get('monitor', 'the monitored score')} did not improve{by} for {state.get('wait_count')} "
            f"validations in a row (patience {state.get('patience')}); its best, {float(state.get('best_score')):.4f}, "
            f"was at step {'?' if step is None else step}")


def stopped_state(checkpoint: dict) -> dict | None:
    """A checkpoint's early-stopping state when it says training stopped early; else None."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if key.startswith("EarlyStopping") and isinstance(state, dict) and \
                state.get("stopping_reason", NOT_STOPPED) != NOT_STOPPED:
            return state
    return None
