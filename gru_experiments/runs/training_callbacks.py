"""The training's callbacks that evaluate while it runs: the inference modes over training after every validation,
and the cost estimate a run prints after its first steps (study/cost.py; docs/sweeps.md)."""

import math
import time
from functools import cache
from types import SimpleNamespace
from typing import Iterable

from lightning.pytorch.callbacks import Callback

from gru_experiments.runs.trained_run import TrainedRun, evaluate, plan
from gru_experiments.study.cost import EvaluationClock, describe_estimate, estimate
from gru_experiments.study.evaluation import EvaluationSettings
from gru_experiments.study.generation import STUDY_PROMPTS, tokens_for_chars
from gru_experiments.study.modes import OVER_TRAINING_MODES
from gru_experiments.study.plan import BEST, OVER_TRAINING
from gru_experiments.study.scores import Split
from gru_experiments.study.text_index import vocabulary


class ModesOverTraining(Callback):
    """`run`: the model in training, its tokenizer and seed; `epoch_tokens`: what evaluation.budget is a multiple
    of here; `train_text`: the training split's (or its pieces, in order), for the word validity."""

    def __init__(self, run: TrainedRun, val: Split, epoch_tokens: int, settings: EvaluationSettings,
                 train_text: str | Iterable[str]):
        self.run, self.val, self.settings = run, val, settings

        @cache
        def words_only():  # what the word validity reads of a training index: its words, read when first asked
            return SimpleNamespace(vocabulary=vocabulary([train_text] if isinstance(train_text, str) else train_text))

        self.asked = dict(training_tokens=epoch_tokens, purpose=OVER_TRAINING, load_text_index=words_only)

    def plan(self):
        return plan(self.run, self.settings, self.val, **self.asked)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        figures = evaluate(self.run, self.settings, self.val, **self.asked).summary()
        for mode in OVER_TRAINING_MODES:
            pl_module.log(f"val/{mode}_bpc", figures[f"{mode}_bpc"])
            if figures.get(f"{mode}_word_validity") is not None:
                pl_module.log(f"val/{mode}_word_validity", figures[f"{mode}_word_validity"])


class CostEstimate(Callback):
    """Prints the estimate once `min_steps` steps after the first (a warm-up) are timed, or `min_seconds`: the
    training steps left, the validations, the final weights' plan and the best checkpoint's."""

    def __init__(self, run: TrainedRun, val: Split, settings: EvaluationSettings, *, tokens_per_step: int,
                 epoch_tokens: int, eval_batch_size: int = 64, modes: ModesOverTraining | None = None,
                 train_ids=None, probe=None, min_steps: int = 10, min_seconds: float = 20.0,
                 validation_targets: int | None = None):
        self.run, self.val, self.settings, self.modes = run, val, settings, modes
        self.validation_targets = validation_targets or val.n_targets  # what a validation over training scores
        self.tokens_per_step, self.epoch_tokens, self.eval_batch_size = tokens_per_step, epoch_tokens, eval_batch_size
        self.train_ids, self.probe, self.min_steps, self.min_seconds = train_ids, probe, min_steps, min_seconds
        self._first_step: int | None = None
        self._started = 0.0
        self.estimate: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.estimate is not None or trainer.fast_dev_run:
            return
        if self._first_step is None:  # the first step warms up: timing starts after it
            self._first_step, self._started = trainer.global_step, time.perf_counter()
            return
        steps, seconds = trainer.global_step - self._first_step, time.perf_counter() - self._started
        if steps >= self.min_steps or (steps >= 1 and seconds >= self.min_seconds):
            self.estimate = self.compute(trainer, seconds / steps)
            if trainer.is_global_zero:
                print(describe_estimate(self.estimate), flush=True)

    def compute(self, trainer, step_seconds: float) -> dict:
        total_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
            trainer.estimated_stepping_batches
        epochs = max(int(trainer.max_epochs or 1) - trainer.current_epoch, 1)
        per_epoch = getattr(trainer, "num_training_batches", None)
        if isinstance(per_epoch, int) and per_epoch > 0:  # max_steps may end training before the epochs do
            epochs = max(min(epochs, math.ceil(int(total_steps) / per_epoch) - trainer.current_epoch), 1)
        final, best = self.plans(int(total_steps) * self.tokens_per_step)
        modes = self.modes.plan() if self.modes is not None else plan(
            self.run, self.settings, self.val, training_tokens=self.epoch_tokens, purpose=OVER_TRAINING)
        return estimate(EvaluationClock.of(self.run.model, self.settings.seq_len), step_seconds=step_seconds,
                        steps_left=max(int(total_steps) - trainer.global_step, 0), validations=epochs,
                        val_targets=self.validation_targets, eval_batch_size=self.eval_batch_size, over_training=modes,
                        final=final, best=best, sample_steps=2 * len(STUDY_PROMPTS) * tokens_for_chars(
                            self.settings.samples.chars, self.val))  # stateful and stateless, a prompt at a time

    def plans(self, training_tokens: int):
        """The final weights' plan, and the best checkpoint's (run only where it is not the final one)."""
        asked = dict(training_tokens=training_tokens, train_ids=self.train_ids, probe=self.probe)
        return (plan(self.run, self.settings, self.val, **asked),
                plan(self.run, self.settings, self.val, purpose=BEST, **asked))
