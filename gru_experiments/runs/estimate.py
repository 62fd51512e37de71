"""After its first training steps a run prints its estimated time: the steps left at the measured rate, plus
the forward tokens of the plans it will run at that rate times EVAL_FORWARD_SPEEDUP (docs/sweeps.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from lightning.pytorch.callbacks import Callback

from gru_experiments.runs.recipe import recipe_length
from gru_experiments.runs.scoring import run_request
from gru_experiments.study.evaluation import plan_for
from gru_experiments.study.plan import BEST, OVER_TRAINING
from gru_experiments.study.scores import Split
from gru_experiments.study.settings import EvaluationSettings

# Forward tokens/s of the evaluation (windows in big batches) over the training tokens/s (forward,
# backward, AdamW), measured side by side (benchmarks/RESULTS.md). The lowest, so that the estimate errs long.
EVAL_FORWARD_SPEEDUP = 1.5


def format_estimate(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class CostEstimate(Callback):
    """Prints the estimate once `min_steps` steps after the first (a warm-up) are timed, or `min_seconds`."""

    def __init__(self, val: Split, cfg, settings: EvaluationSettings, *, model, tokenizer=None, modes=None,
                 train_ids=None, probe=None, min_steps: int = 10, min_seconds: float = 20.0):
        self.val, self.cfg, self.settings, self.tokenizer, self.modes = val, cfg, settings, tokenizer, modes
        self.train_ids, self.probe = train_ids, probe
        self.seq_len, self.batch_size, self.steps_per_epoch = cfg.data.seq_len, cfg.data.batch_size, \
            recipe_length(cfg)[1]
        self.model, self.min_steps, self.min_seconds = model, min_steps, min_seconds
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
                print(self.describe(self.estimate), flush=True)

    def compute(self, trainer, step_seconds: float) -> dict:
        total_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
            trainer.estimated_stepping_batches
        steps_left = max(int(total_steps) - trainer.global_step, 0)
        tokens_per_step = self.batch_size * self.seq_len
        forward_seconds = step_seconds / tokens_per_step / EVAL_FORWARD_SPEEDUP  # per forward token
        epochs = max(int(trainer.max_epochs or 1) - trainer.current_epoch, 1)
        per_epoch = getattr(trainer, "num_training_batches", None)
        if isinstance(per_epoch, int) and per_epoch > 0:  # max_steps may end training before the epochs do
            epochs = max(min(epochs, math.ceil(int(total_steps) / per_epoch) - trainer.current_epoch), 1)
        evaluation = self.evaluation_forward_tokens(self.model, int(total_steps) * tokens_per_step)
        modes = self.modes.plan(self.model) if self.modes is not None else plan_for(
            run_request(self.cfg, self.model, self.val, self.steps_per_epoch * tokens_per_step, self.settings,
                        OVER_TRAINING))
        validation = self.val.n_targets + modes.forward_tokens  # the chunked pass (val_loss), then the modes
        estimate = {"step_seconds": step_seconds, "steps_left": steps_left,
                    "train_seconds": steps_left * step_seconds,
                    "validation_seconds": epochs * validation * forward_seconds,
                    "eval_forward_tokens": evaluation, "eval_seconds": evaluation * forward_seconds}
        estimate["total_seconds"] = (estimate["train_seconds"] + estimate["validation_seconds"]
                                     + estimate["eval_seconds"])
        return estimate

    def evaluation_forward_tokens(self, model, training_tokens: int) -> int:
        """The final weights' plan and the best checkpoint's (counted as if it were not the final one)."""
        final = run_request(self.cfg, model, self.val, training_tokens, self.settings, tokenizer=self.tokenizer,
                            train_ids=self.train_ids, probe=self.probe)
        return plan_for(final).forward_tokens + plan_for(replace(final, purpose=BEST)).forward_tokens

    @staticmethod
    def describe(e: dict) -> str:
        return (f"estimated time left: {format_estimate(e['total_seconds'])} = training "
                f"{format_estimate(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
                f"+ validation {format_estimate(e['validation_seconds'])} + end-of-run evaluation "
                f"{format_estimate(e['eval_seconds'])} ({e['eval_forward_tokens'] / 1e6:.1f}M forward tokens; "
                "evaluation.budget bounds it)")
