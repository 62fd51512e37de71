"""The end-of-run evaluation of a model, from the `evaluation` config group: every inference mode,
the bigram baseline, the context curve and stateful - windowed (docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gru_experiments.study.context_curve import context_curve, curve_stride, long_point_budget, sample_stride
from gru_experiments.study.inference import MODES
from gru_experiments.study.progress import NO_PROGRESS
from gru_experiments.study.scores import (Score, Split, paired_difference, score_bigram, score_stateful,
                                          score_stateless, score_windowed, sees_whole_window, windowed_stride)

FIGURES = (*MODES, "bigram")  # what the evaluation reports: every inference mode and the bigram baseline


@dataclass
class Evaluation:
    scores: dict[str, Score]  # FIGURES -> Score
    settings: dict  # the settings actually used
    curve: dict | None = None  # context_curve's result
    gain: Score | None = None  # stateful - windowed, paired (paired_difference), warm targets only

    def metrics(self) -> dict:
        """{"stateful_nll": ..., "stateful_bpc": ..., ..., "state_gain_bpc", "state_gain_se"} for
        summary.json and the loggers."""
        metrics = mode_metrics(self.scores)
        if self.gain is not None:
            metrics["state_gain_bpc"], metrics["state_gain_se"] = self.gain.bpc, self.gain.bpc_se
        return metrics


def mode_metrics(scores: dict[str, Score]) -> dict[str, float]:
    """<mode>_nll and <mode>_bpc, and <mode>_bpc_se: the standard error of the bpc as a mean over the
    targets scored, taken as independent draws from text like the split's (Score.bpc_se). It is what
    separates two models' figures (finding 7), not a sampling error: a whole-split figure has it too."""
    metrics = {}
    for mode, score in scores.items():
        metrics[f"{mode}_nll"] = score.nll
        metrics[f"{mode}_bpc"] = score.bpc
        metrics[f"{mode}_bpc_se"] = score.bpc_se
    return metrics


def whole_split(settings: dict, curve: dict | None = None) -> bool:
    """Every figure scored every target of the split (no sample: the windowed stride and every
    curve point's stride 1)."""
    n = settings.get("split_targets")
    points = (curve or {}).get("settings", {}).get("targets", {})
    return settings.get("windowed_targets") == n and all(t == n for t in points.values())


def describe_sample(settings: dict, curve: dict | None = None) -> str:
    """What the evaluation scored, in words, for the log."""
    if whole_split(settings, curve):
        return "the whole validation split"
    budget = f", evaluation.max_tokens={settings['max_tokens']}" if settings.get("max_tokens") else ""
    return (f"the whole validation split for stateful, stateless and bigram; windowed and the context curve a "
            f"systematic sample (windowed: one target in {settings['windowed_stride']}, "
            f"{settings['windowed_targets']:,} of {settings['split_targets']:,}, standard error "
            f"{settings.get('windowed_bpc_se', float('nan')):.4f} bits per character{budget})")


def format_modes(scores: dict[str, Score]) -> str:
    lines = [f"{'mode':<10} {'nats/token':>10} {'bits/char':>10} {'targets':>9}"]
    for mode, score in scores.items():
        lines.append(f"{mode:<10} {score.nll:>10.4f} {score.bpc:>10.4f} {score.tokens:>9,}")
    return "\n".join(lines)


def evaluation_window(settings, seq_len: int) -> int:
    """The windowed mode's context: evaluation.window (the one key, for scoring and sampling),
    null meaning the training window data.seq_len."""
    return int(settings.get("window") or seq_len)


def evaluate(model, train_ids: Tensor, val: Split, seq_len: int, settings, training_tokens: int | None = None, *,
             stateful: Score | None = None, curve: bool = True, progress=NO_PROGRESS) -> Evaluation:
    """The validation split in every inference mode, the training split's bigram table and (curve)
    the context curve, with the `evaluation` config group's settings (conf/evaluation/default.yaml).
    `stateful`: that figure when it is already known for these weights (the last validation's).

    evaluation.max_tokens (null: the whole split) caps the targets of the windowed figure and of
    every context-curve point, the passes that cost a window per target: every k-th target, a
    systematic sample, its standard error in the settings ("windowed_bpc_se"; the curve's per
    point). stateful, stateless and bigram cost one pass over the split and always score all of it.
    `progress`: a bar per mode and per curve pass (progress.py)."""
    device = model.device
    val = val.to(device)
    window = evaluation_window(settings, seq_len)
    n_targets = val.n_targets
    stride = windowed_stride(settings.get("windowed_stride", "auto"), n_targets, window, training_tokens)
    if sees_whole_window(model, window) and settings.get("windowed_stride", "auto") == "auto":
        stride = 1  # exact at the cost of one pass (see score_windowed)
    max_targets = settings.get("max_tokens")
    stride = max(stride, sample_stride(n_targets, max_targets))
    streams = int(settings.streams)
    batch_tokens = int(settings.get("batch_tokens", 1 << 16))
    used = {"seq_len": seq_len, "streams": streams, "window": window, "windowed_stride": stride,
            "windowed_targets": len(range(1, n_targets + 1, stride)), "max_tokens": max_targets,
            "split_targets": n_targets}
    # The paired stateful - windowed keeps only the targets whose stream has carried the state past one
    # window: before that the state has seen less than the window has (each stream's cold start).
    keep = window if curve else None
    if stateful is None or stateful.tokens != n_targets:  # a sample (evaluation.validation_tokens) is not reused
        with progress.phase("stateful", n_targets) as tick:
            stateful = score_stateful(model, val, seq_len, streams, targets_after=keep, tick=tick)
    point_tokens = settings.get("curve_point_tokens")
    long_curve = {"longest": settings.get("curve_longest"),
                  "long_tokens": long_point_budget(settings.get("long_point_tokens"), training_tokens)}
    by_context: dict[int, Score] = {}
    context = None
    if curve and window == seq_len and not sees_whole_window(model, window):
        # One pass of windows gives the windowed figure and every shorter context (score_contexts).
        context = context_curve(model, val, max_window=seq_len, stateful=stateful, point_tokens=point_tokens,
                                shared_stride=stride, batch_tokens=batch_tokens, scores_out=by_context,
                                targets=True, max_targets=max_targets, progress=progress, **long_curve)
        windowed = by_context[window]
    else:
        one_pass = sees_whole_window(model, window)  # then the bar counts targets, as stateful's
        with progress.phase("windowed", n_targets if one_pass else used["windowed_targets"] * window) as tick:
            windowed = score_windowed(model, val, window, stride, batch_tokens, targets=curve, tick=tick)
        if curve:
            context = context_curve(model, val, max_window=seq_len, stateful=stateful, point_tokens=point_tokens,
                                    shared_stride=max(curve_stride(n_targets, seq_len, point_tokens),
                                                      sample_stride(n_targets, max_targets)),
                                    batch_tokens=batch_tokens, max_targets=max_targets, progress=progress,
                                    whole_context=windowed if one_pass else None,
                                    **long_curve)
    scores = {"stateful": stateful, "stateless": score_stateless(model, val), "windowed": windowed,
              "bigram": score_bigram(train_ids, val)}
    used["windowed_bpc_se"] = 0.0 if windowed.tokens == n_targets else windowed.bpc_se
    gain = None
    if curve:  # the final weights
        if stateful.positions is None:  # the last validation's figure, kept no targets: one more cheap pass
            with progress.phase("stateful (paired with windowed)", n_targets) as tick:
                stateful = score_stateful(model, val, seq_len, streams, targets_after=keep, tick=tick)
        gain = paired_difference(stateful, windowed, val)
    return Evaluation(scores, used, context, gain)
