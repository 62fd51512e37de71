"""The cost of a run, known before it is paid: after its first training steps a run prints its
estimated total time, training plus validation plus the end-of-run evaluation (docs/sweeps.md).

The training time is the measured seconds per step times the steps left. The evaluation's is
counted in forward tokens (the tokens it runs through the model: `planned_forward_tokens`,
which follows `evaluation.evaluate`'s choices of stride and budget) at the measured training rate
times EVAL_FORWARD_SPEEDUP: a forward pass without backward or update, in big batches, runs
that many times as many tokens per second as a training step (measured, benchmarks/RESULTS.md).
An estimate: the machine's load moves it, and so does a best checkpoint that is not the final one
(the evaluation scores it too; counted here as if it were).
"""

from __future__ import annotations

import math
import time

from lightning.pytorch.callbacks import Callback

from gru_experiments.study.context_curve import curve_lengths, curve_stride, long_point_budget, sample_stride
from gru_experiments.study.evaluation import evaluation_window
from gru_experiments.study.scores import sees_whole_window, windowed_stride

# Forward tokens/s of the evaluation (windows in batches of evaluation.batch_tokens) over the
# training tokens/s (forward, backward, AdamW), measured side by side on the 2-core AMD EPYC, one
# thread: Astra-alpha 2.9x, Astra-gamma 3.3x, Scribe-beta 1.5x (its 1,000-token head makes scoring
# big batches relatively dear). The lowest, so that the estimate errs long.
EVAL_FORWARD_SPEEDUP = 1.5


def planned_forward_tokens(model, n_targets: int, seq_len: int, settings, training_tokens: int | None,
                           best: bool = True) -> int:
    """Tokens the end-of-run evaluation runs through the model on a split of `n_targets` targets:
    stateful, windowed (its stride and evaluation.max_tokens) and the context curve's own passes;
    with `best`, the best checkpoint's scores (validation, stateful, windowed) once more."""
    window = evaluation_window(settings, seq_len)
    n = n_targets
    one_pass = n * model.tokens_per_prediction  # a pass over the split, its state carried (stateful)
    max_targets = settings.get("max_tokens")
    stride = windowed_stride(settings.get("windowed_stride", "auto"), n, window, training_tokens)
    if sees_whole_window(model, window):
        stride = max(1 if settings.get("windowed_stride", "auto") == "auto" else stride, sample_stride(n, max_targets))
        costly = model.tokens_per_prediction > 1  # then a sample runs its own windows (scores.score_windowed)
        windowed = len(range(1, n + 1, stride)) * model.context if costly and stride > 1 else one_pass
    else:
        stride = max(stride, sample_stride(n, max_targets))
        windowed = len(range(1, n + 1, stride)) * window
    curve = 0
    lengths, beyond = curve_lengths(model, seq_len, settings.get("curve_longest"), n)
    point_tokens = settings.get("curve_point_tokens")
    shares_windowed = window == seq_len and not sees_whole_window(model, window)  # evaluation.evaluate's branches
    shared_stride = stride if shares_windowed else max(curve_stride(n, seq_len, point_tokens),
                                                       sample_stride(n, max_targets))
    shared = False
    for w in lengths + beyond:
        if sees_whole_window(model, w):  # the windowed figure itself, or one exact pass (context_curve)
            reused = sees_whole_window(model, window) and (stride == 1 or model.tokens_per_prediction > 1)
            curve += 0 if reused else one_pass
        elif w not in beyond:  # (the long points are counted below)
            point_stride = max(curve_stride(n, w, point_tokens), sample_stride(n, max_targets))
            if w != seq_len and point_stride < shared_stride:  # a point with its own pass
                curve += len(range(1, n + 1, point_stride)) * w
            else:
                shared = True
    if shared and not shares_windowed:  # the curve's own pass of windows of seq_len
        curve += len(range(1, n + 1, shared_stride)) * seq_len
    long = [w for w in beyond if not sees_whole_window(model, w)]
    if long:  # each past the training window, and a reference pass at it, on the same sample
        budget = long_point_budget(settings.get("long_point_tokens"), training_tokens)
        long_stride = max(curve_stride(n, sum(long) + seq_len, budget),
                          sample_stride(n, max_targets))
        curve += len(range(1, n + 1, long_stride)) * (sum(long) + seq_len)
    final = one_pass + windowed + curve  # stateful once (its targets kept for the pairing with windowed)
    return final + (n + one_pass + windowed if best else 0)


def validation_forward_tokens(model, n_targets: int, settings) -> int:
    """Tokens one validation runs through the model: the chunked pass (val_loss) and the stateful
    figure (the modes over training; evaluation.validation_tokens bounds a costly one)."""
    stateful = n_targets * model.tokens_per_prediction
    budget = settings.get("validation_tokens")
    if model.tokens_per_prediction > 1 and budget:
        stateful = min(stateful, int(budget))
    return n_targets + stateful


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

    def __init__(self, val_targets: int, seq_len: int, batch_size: int, settings, *, model=None,
                 min_steps: int = 10, min_seconds: float = 20.0):
        self.val_targets, self.seq_len, self.batch_size, self.settings = val_targets, seq_len, batch_size, settings
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
        evaluation = planned_forward_tokens(model, self.val_targets, self.seq_len, self.settings,
                                            int(total_steps) * tokens_per_step)
        estimate = {"step_seconds": step_seconds, "steps_left": steps_left,
                    "train_seconds": steps_left * step_seconds,
                    "validation_seconds": epochs * validation_forward_tokens(model, self.val_targets, self.settings)
                    * forward_seconds,
                    "eval_forward_tokens": evaluation, "eval_seconds": evaluation * forward_seconds}
        estimate["total_seconds"] = estimate["train_seconds"] + estimate["validation_seconds"] + estimate["eval_seconds"]
        return estimate

    @staticmethod
    def describe(e: dict) -> str:
        return (f"estimated time left: {format_estimate(e['total_seconds'])} = training "
                f"{format_estimate(e['train_seconds'])} ({e['steps_left']:,} steps at {e['step_seconds']:.3g} s) "
                f"+ validation {format_estimate(e['validation_seconds'])} + end-of-run evaluation "
                f"{format_estimate(e['eval_seconds'])} ({e['eval_forward_tokens'] / 1e6:.1f}M forward tokens; "
                "evaluation.max_tokens bounds it)")
