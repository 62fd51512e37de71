"""The inference modes over training: after every validation, val/stateful_bpc, val/stateless_bpc and the word
validity of a stateful and a stateless sample, as one OVER_TRAINING evaluation within an epoch's budget."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import Callback

from gru_experiments.runs.scoring import run_request
from gru_experiments.study.evaluation import EvaluationSettings, evaluate, plan_for
from gru_experiments.study.plan import OVER_TRAINING, STATEFUL, STATELESS
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import words


class ModesOverTraining(Callback):
    """`epoch_tokens`: what evaluation.budget is a multiple of here. The word validity needs a `tokenizer` and
    the training split's text."""

    def __init__(self, cfg, val: Split, epoch_tokens: int, settings: EvaluationSettings, tokenizer=None,
                 train_text: str | None = None):
        self.cfg, self.val, self.epoch_tokens, self.settings = cfg, val, epoch_tokens, settings
        self.tokenizer = tokenizer if train_text is not None else None
        # what the word validity reads of a training index: its words (counted here without the rest)
        self.index = SimpleNamespace(vocabulary=frozenset(words(train_text))) if self.tokenizer is not None else None
        self.last: dict | None = None  # the latest validation's summary

    def request(self, model):
        return run_request(self.cfg, model, self.val, self.epoch_tokens, self.settings, OVER_TRAINING,
                           tokenizer=self.tokenizer, load_text_index=lambda: self.index)

    def plan(self, model):
        return plan_for(self.request(model))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self.last = evaluate(self.request(pl_module.model)).summary()
        for mode in (STATEFUL, STATELESS):
            pl_module.log(f"val/{mode}_bpc", self.last[f"{mode}_bpc"])
            if self.last.get(f"{mode}_word_validity") is not None:
                pl_module.log(f"val/{mode}_word_validity", self.last[f"{mode}_word_validity"])

