"""The cost of a run, known before it is paid: after its first training steps a run prints its
estimated total time, training plus validation plus the end-of-run evaluation (docs/sweeps.md).

The training time is the measured seconds per step times the steps left. The evaluation's is its
plans' forward tokens (study/plan.py: the same plans the run executes, summed here) at the measured
training rate times EVAL_FORWARD_SPEEDUP: a forward pass without backward or update, in big batches,
runs that many times as many tokens per second as a training step (measured, benchmarks/RESULTS.md).
An estimate: the machine's load moves it, and so does a best checkpoint that is not the final one
(the evaluation scores it too; counted here as if it were).
"""

from __future__ import annotations

import math
import time

from lightning.pytorch.callbacks import Callback

from gru_experiments.study.evaluation import plan_for
from gru_experiments.study.scores import Split
from gru_experiments.study.text_protocol import fitting, text_demand, text_settings

# Forward tokens/s of the evaluation (windows in big batches) over the training tokens/s (forward,
# backward, AdamW), measured side by side on the 2-core AMD EPYC, one thread: Astra-alpha 2.9x,
# Astra-gamma 3.3x, Scribe-beta 1.5x (its 1,000-token head makes scoring big batches relatively
# dear). The lowest, so that the estimate errs long.
EVAL_FORWARD_SPEEDUP = 1.5


def evaluation_forward_tokens(model, n_targets: int, seq_len: int, settings, training_tokens: int,
                              best: bool = True, text=None) -> int:
    """Forward tokens of the end-of-run evaluation: the final weights' plan (with the text statistics'
    samples when `text`, a plan.TextDemand, asks for them) and (best) the best checkpoint's (without the
    curve)."""
    tokens = plan_for(model, n_targets, seq_len, settings, training_tokens, text=text).forward_tokens
    if best:
        tokens += plan_for(model, n_targets, seq_len, settings, training_tokens, curve=False).forward_tokens
    return tokens


def validation_forward_tokens(model, n_targets: int, seq_len: int, settings, epoch_tokens: int, modes=None) -> int:
    """Forward tokens of one validation: the chunked pass (val_loss) and the modes' plan (runs/modes.py:
    `modes`'s own when given)."""
    if modes is not None:
        return n_targets + modes.plan(model).forward_tokens
    modes = plan_for(model, n_targets, seq_len, settings, epoch_tokens, windowed=False, bigram=False, curve=False)
    return n_targets + modes.forward_tokens


def format_estimate(seconds: float) -> str:
    """A duration as an estimate says it: rounded (12 s, 7 min, 1.5 h)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class CostEstimate(Callback):
    """Prints the run's estimated time once, after its first training steps: when `min_steps`
    steps after the first (which warms up) are timed, or a step or more took `min_seconds`."""

    def __init__(self, val: Split, cfg, *, model=None, tokenizer=None, modes=None, min_steps: int = 10,
                 min_seconds: float = 20.0):
        self.val, self.val_targets, self.settings = val, val.n_targets, cfg.evaluation
        self.tokenizer, self.modes, self.seed = tokenizer, modes, int(cfg.get("seed", 0))
        self.seq_len, self.batch_size, self.steps_per_epoch = (cfg.data.seq_len, cfg.data.batch_size,
                                                               cfg.data.steps_per_epoch)
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
        model = self.model if self.model is not None else trainer.lightning_module.model
        text = None if self.tokenizer is None else text_demand(model, self.tokenizer, self.val, fitting(
            text_settings(self.settings, self.seq_len, self.seed), self.val.characters))
        evaluation = evaluation_forward_tokens(model, self.val_targets, self.seq_len, self.settings,
                                               int(total_steps) * tokens_per_step, text=text)
        validation = validation_forward_tokens(model, self.val_targets, self.seq_len, self.settings,
                                               self.steps_per_epoch * tokens_per_step, self.modes)
        estimate = {"step_seconds": step_seconds, "steps_left": steps_left,
                    "train_seconds": steps_left * step_seconds,
                    "validation_seconds": epochs * validation * forward_seconds,
                    "eval_forward_tokens": evaluation, "eval_seconds": evaluation * forward_seconds}
        estimate["total_seconds"] = (estimate["train_seconds"] + estimate["validation_seconds"]
                                     + estimate["eval_seconds"])
        return estimate

    @staticmethod
    def describe(e: dict) -> str:
        return (f"estimated time left: {format_estimate(e['total_seconds'])} = training "
                f"{format_estimate(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
                f"+ validation {format_estimate(e['validation_seconds'])} + end-of-run evaluation "
                f"{format_estimate(e['eval_seconds'])} ({e['eval_forward_tokens'] / 1e6:.1f}M forward tokens; "
                "evaluation.budget bounds it)")
