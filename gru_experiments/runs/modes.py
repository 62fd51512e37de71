"""The inference modes over training: after every validation, the stateful and stateless figures of
the weights of that moment (val/stateful_bpc, val/stateless_bpc in the loggers and history.csv), and
the word validity of a short stateful and a short stateless sample (val/stateful_word_validity,
val/stateless_word_validity: the seed's lesson 3), as one plan (study/plan.py) within the budget of
an epoch's training tokens."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from gru_experiments.study.evaluation import evaluate, plan_for
from gru_experiments.study.plan import STATEFUL, STATELESS
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import words
from gru_experiments.study.text_protocol import short_text_demand, word_validity_over_training


class ModesOverTraining(Callback):
    """Scores `val` stateful and stateless after every validation. `epoch_tokens`: the training tokens
    between two validations, what evaluation.budget is a multiple of here. With a `tokenizer` and the
    training split's text (`train_text`), and evaluation.text_samples > 0, also the word validity of
    one sample per study prompt of evaluation.text_chars characters in each of the two modes."""

    def __init__(self, val: Split, seq_len: int, settings, epoch_tokens: int, tokenizer=None,
                 train_text: str | None = None, seed: int = 0):
        self.val, self.seq_len, self.settings, self.epoch_tokens = val, seq_len, settings, epoch_tokens
        self.tokenizer, self.seed = tokenizer, seed
        self.chars = int(settings.get("text_chars", 300))
        measured = tokenizer is not None and train_text is not None and settings.get("text_samples", 0)
        self.vocabulary = frozenset(words(train_text)) if measured else None
        self.last: dict | None = None  # the latest validation's Scores

    def plan(self, model):
        demand = self.vocabulary is not None and short_text_demand(model, self.tokenizer, self.val, self.chars,
                                                                   self.seed)
        return plan_for(model, self.val.n_targets, self.seq_len, self.settings, self.epoch_tokens,
                        windowed=False, bigram=False, curve=False, text=demand or None)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        model = pl_module.model
        plan = self.plan(model)
        self.last = evaluate(model, None, self.val, plan).scores
        for mode in (STATEFUL, STATELESS):
            pl_module.log(f"val/{mode}_bpc", self.last[mode].bpc)
        if plan.text is not None:
            validity = word_validity_over_training(model, self.tokenizer, self.vocabulary, self.val.to(model.device),
                                                   self.chars, self.seed, plan.text)
            for mode, value in validity.items():
                if value is not None:
                    pl_module.log(f"val/{mode}_word_validity", value)
