"""The inference modes over training: after every validation, the stateful and stateless figures of
the weights of that moment (val/stateful_bpc, val/stateless_bpc in the loggers and history.csv), as
a plan of two figures (study/plan.py) within the budget of an epoch's training tokens."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from gru_experiments.study.evaluation import evaluate, plan_for
from gru_experiments.study.plan import STATEFUL, STATELESS
from gru_experiments.study.scores import Split


class ModesOverTraining(Callback):
    """Scores `val` stateful and stateless after every validation. `epoch_tokens`: the training tokens
    between two validations, what evaluation.budget is a multiple of here."""

    def __init__(self, val: Split, seq_len: int, settings, epoch_tokens: int):
        self.val, self.seq_len, self.settings, self.epoch_tokens = val, seq_len, settings, epoch_tokens
        self.last: dict | None = None  # the latest validation's Scores

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        model = pl_module.model
        plan = plan_for(model, self.val.n_targets, self.seq_len, self.settings, self.epoch_tokens,
                        windowed=False, bigram=False, curve=False)
        self.last = evaluate(model, None, self.val, plan).scores
        for mode in (STATEFUL, STATELESS):
            pl_module.log(f"val/{mode}_bpc", self.last[mode].bpc)
