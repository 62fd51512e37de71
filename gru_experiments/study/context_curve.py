"""The context curve: bits per character with the model given only the last w tokens, from its
initial state, for w = 1, 2, 4, ... up to the training window and on past it, and with the state
carried (docs/evaluation.md)."""

from __future__ import annotations

import math

from gru_experiments.study.progress import NO_PROGRESS
from gru_experiments.study.scores import Score, Split, paired_difference, score_contexts, score_in_one_pass, sees_whole_window


def context_lengths(max_window: int) -> list[int]:
    """1, 2, 4, ... below max_window, then max_window itself (the training window)."""
    lengths, w = [], 1
    while w < max_window:
        lengths.append(w)
        w *= 2
    return lengths + [max_window]


def long_context_lengths(max_window: int, longest: int | None, n_targets: int) -> list[int]:
    """The curve's points past the training window: 2, 4, 8 ... times max_window up to `longest`
    (256, 512, 1024 for a window of 128 and longest 1024), each where the split has a target with
    that much context before it."""
    lengths, w = [], 2 * max_window
    while longest and w <= longest and w < n_targets:
        lengths.append(w)
        w *= 2
    return lengths


def sample_stride(n_targets: int, max_targets: int | None) -> int:
    """evaluation.max_tokens: every k-th target, the smallest k that scores at most `max_targets`
    of the split's targets (1, the whole split, when unset)."""
    if not max_targets:
        return 1
    return max(1, math.ceil(n_targets / int(max_targets)))


def long_point_budget(long_point_tokens: int | None, training_tokens: int | None) -> int | None:
    """The forward tokens the curve's points past the training window may run: evaluation.long_point_tokens,
    and never more than training ran (as windowed_stride=auto), so a short run is scored quickly."""
    budgets = [int(b) for b in (long_point_tokens, training_tokens) if b]
    return min(budgets) if budgets else None


def curve_stride(n_targets: int, window: int, point_tokens: int | None) -> int:
    """Every target (exact) when that runs at most `point_tokens` tokens through the model
    (n_targets x window); else every k-th target, the smallest k within the budget."""
    if not point_tokens:
        return 1
    return max(1, math.ceil(n_targets * window / int(point_tokens)))


def curve_lengths(model, max_window: int, longest: int | None, n_targets: int) -> tuple[list[int], list[int]]:
    """The curve's points up to the training window and past it (`context_lengths`,
    `long_context_lengths`). A finite-context model's curve stops at the first point that holds its
    whole context (128 for a transformer of block 128, 16 for the MLP): past it, every point is the same."""
    lengths, beyond = context_lengths(max_window), long_context_lengths(max_window, longest, n_targets)
    context = getattr(model, "context", None)
    stop = next((w for w in lengths + beyond if context is not None and w >= context), None)
    if stop is None:
        return lengths, beyond
    return [w for w in lengths if w <= stop], [w for w in beyond if w <= stop]


def context_curve(model, split: Split, *, max_window: int, stateful: Score, point_tokens: int | None,
                  shared_stride: int = 1, batch_tokens: int = 1 << 16, scores_out: dict | None = None,
                  longest: int | None = None, long_tokens: int | None = None, targets: bool = False,
                  max_targets: int | None = None, progress=NO_PROGRESS, whole_context: Score | None = None) -> dict:
    """Bits per character with the model seeing only the last w tokens, from its initial state,
    for w in `context_lengths(max_window)` and past the training window up to `longest`
    (`long_context_lengths`), and with the state carried ("stateful": `stateful`, already scored).

    Every point comes from one pass of windows of max_window tokens (`score_contexts`), scoring
    every `shared_stride`-th target (the windowed figure's stride). A point whose exact figure fits
    in `point_tokens` forward tokens (n_targets x w) but that the shared pass sampled gets its own
    pass, scoring every k-th target with k the smallest stride within that budget (`curve_stride`).
    The point max_window always comes from the shared pass: it is the windowed figure at the
    training window. The points past it score every k-th target, k the smallest stride that keeps
    their passes and a reference pass at max_window on the same targets within `long_tokens`
    forward tokens: a long point is the max_window point plus its paired difference from the
    reference (a difference estimator; its standard error is the difference's, docs/evaluation.md).
    A finite-context model's curve stops at the first w that holds its context (`curve_lengths`),
    a point scored in one pass, exactly (`whole_context`: that figure when it is already scored on
    every target, e.g. the windowed one).
    `scores_out`, when given, receives {w: Score}; targets=True keeps the targets of the point
    max_window (the windowed figure) in its Score. `max_targets` (evaluation.max_tokens) caps the
    targets any point scores (`sample_stride`). `progress`: a bar per pass (progress.py).

    Returns {"1": bpc, "2": bpc, ..., "stateful": bpc, "settings": {...}}: the settings record,
    per point, the targets scored, the stride, the tokens run through the model for it and the
    standard error of a sampled point (0 for an exact one)."""
    n = split.n_targets
    lengths, beyond = curve_lengths(model, max_window, longest, n)
    one_pass = [w for w in lengths + beyond if sees_whole_window(model, w)]

    def point_stride(w: int) -> int:
        return max(curve_stride(n, w, point_tokens), sample_stride(n, max_targets))

    own = [w for w in lengths if w not in one_pass and w != max_window and point_stride(w) < shared_stride]
    shared = [w for w in lengths if w not in one_pass and w not in own]
    long = [w for w in beyond if w not in one_pass]
    scores, strides, forward = {}, {}, {}
    bpc, se = {}, {}  # the points past max_window (difference estimates)
    if shared:
        passes = len(range(1, n + 1, shared_stride))
        with progress.phase(f"windowed and context curve {', '.join(map(str, shared))}",
                            passes * max_window) as tick:
            scores |= score_contexts(model, split, max_window, shared, shared_stride, batch_tokens,
                                     targets=targets, tick=tick)
        for w in shared:
            strides[w], forward[w] = shared_stride, 0  # shared: the windowed pass's forward tokens
        forward[max(shared)] = len(range(1, n + 1, shared_stride)) * max_window
    if long:
        # A difference estimator: each long point is the max_window point plus its difference from
        # it, paired on a sample of targets (every k-th, the same for every long point and for a
        # reference pass at max_window), so the sample's error is that of the difference alone.
        stride = max(curve_stride(n, sum(long) + max_window, long_tokens), sample_stride(n, max_targets))
        passes = len(range(1, n + 1, stride))
        with progress.phase(f"context curve {max_window} (reference)", passes * max_window) as tick:
            reference = score_contexts(model, split, max_window, [max_window], stride, batch_tokens,
                                       targets=True, tick=tick)
        base = scores[max_window]
        base_se = base.bpc_se if base.tokens < n else 0.0
        for w in long:
            with progress.phase(f"context curve {w}", passes * w) as tick:
                scores[w] = score_contexts(model, split, w, [w], stride, batch_tokens, targets=True, tick=tick)[w]
            difference = paired_difference(scores[w], reference[max_window], split)
            strides[w], forward[w] = stride, scores[w].tokens * w
            sampled_se = difference.bpc_se if scores[w].tokens < n else 0.0  # every target: exact
            bpc[w], se[w] = base.bpc + difference.bpc, math.hypot(sampled_se, base_se)
        forward[max(long)] += reference[max_window].tokens * max_window  # the reference pass
    for w in own:
        strides[w] = point_stride(w)
        with progress.phase(f"context curve {w}", len(range(1, n + 1, strides[w])) * w) as tick:
            scores[w] = score_contexts(model, split, w, [w], strides[w], batch_tokens, tick=tick)[w]
        forward[w] = scores[w].tokens * w
    if one_pass:  # a finite-context model sees its whole context at each of these w: one exact pass for all
        costly = model.tokens_per_prediction > 1  # its pass runs a window per prediction: keep the budget's sample
        if whole_context is None or (whole_context.tokens != n and not costly):
            with progress.phase(f"context curve {', '.join(map(str, one_pass))}", n) as tick:
                whole_context = score_in_one_pass(model, split, 1, targets=targets, tick=tick)
            forward[min(one_pass)] = n * model.tokens_per_prediction
        stride = 1 if whole_context.tokens == n else sample_stride(n, max_targets)
        for w in one_pass:
            scores[w], strides[w] = whole_context, stride
            forward.setdefault(w, 0)
    curve, settings = {}, {"max_window": max_window, "curve_point_tokens": point_tokens, "split_targets": n,
                           "longest": max(lengths + beyond), "long_point_tokens": long_tokens,
                           "targets": {}, "stride": {}, "forward_tokens": {}, "bpc_se": {}}
    for w in lengths + beyond:
        key, score = str(w), scores[w]
        curve[key] = bpc.get(w, score.bpc)
        settings["targets"][key], settings["stride"][key] = score.tokens, strides[w]
        settings["forward_tokens"][key] = forward[w]
        settings["bpc_se"][key] = se.get(w, 0.0 if score.tokens == n else score.bpc_se)
    curve["stateful"] = stateful.bpc
    settings["targets"]["stateful"], settings["stride"]["stateful"] = stateful.tokens, 1
    settings["bpc_se"]["stateful"] = 0.0
    curve["settings"] = settings
    if scores_out is not None:
        scores_out.update({w: score for w, score in scores.items() if w not in bpc})
    return curve


def curve_points(curve: dict | None) -> list[tuple[str, float]]:
    """The (context, bpc) points of a summary's context_curve, in order, without its settings."""
    if not isinstance(curve, dict):
        return []
    return [(key, value) for key, value in curve.items()
            if key != "settings" and isinstance(value, (int, float)) and math.isfinite(value)]


def format_curve(curve: dict) -> str:
    settings = curve.get("settings", {})
    lines = [f"{'context':>8} {'bits/char':>10} {'targets':>9} {'stride':>7} {'s.e.':>8}"]
    for key, bpc in curve_points(curve):
        se = settings.get("bpc_se", {}).get(key)
        lines.append(f"{key:>8} {bpc:>10.4f} {settings.get('targets', {}).get(key, 0):>9,} "
                     f"{settings.get('stride', {}).get(key, 1):>7} {'exact' if not se else f'{se:.4f}':>8}")
    return "\n".join(lines)
