"""The context curve: bits per character with the model given only the last w tokens, from its
initial state, for w = 1, 2, 4, ... up to the training window and on past it, and with the state
carried (docs/evaluation.md). Which points, and at what cost, is the plan's (plan.py); evaluation.py
scores them; here is the curve's record in summary.json and its table."""

from __future__ import annotations

import math


def curve_record(plan, points: dict[int, tuple], stateful) -> dict:
    """{"1": bpc, ..., "stateful": bpc, "settings": per point its targets, stride, forward tokens and s.e.}
    from `points`, {context: (bpc, its sampling error (0: exact), targets, stride, the forward tokens of its
    own pass (0: it came with another figure's))}."""
    curve, settings = {}, {"max_window": plan.seq_len, "split_targets": plan.split_targets, "budget": plan.budget,
                           "longest": max(points), "targets": {}, "stride": {}, "forward_tokens": {}, "bpc_se": {}}
    for w, (bpc, se, targets, stride, forward_tokens) in sorted(points.items()):
        key = str(w)
        curve[key] = bpc
        settings["targets"][key], settings["stride"][key] = targets, stride
        settings["forward_tokens"][key], settings["bpc_se"][key] = forward_tokens, se
    curve["stateful"] = stateful.bpc
    settings["targets"]["stateful"], settings["stride"]["stateful"] = stateful.tokens, 1
    settings["bpc_se"]["stateful"] = stateful.sampling_se
    curve["settings"] = settings
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
