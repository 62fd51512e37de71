"""The context curve and stateful - windowed by kind of target (target_classes.py): each figure of the
curve recomputed on one class's targets, from the NLLs its passes kept; each "se" the standard error of
the class's mean (docs/evaluation.md#the-context-curve-by-kind-of-target).
"""

from __future__ import annotations

import math

from gru_experiments.study.plan import STATEFUL, WINDOWED, Plan
from gru_experiments.study.scores import Score, Split, paired_difference, score_at, score_subset
from gru_experiments.study.target_classes import TargetClasses


def curve_by_class(plan: Plan, results: list[dict], scores: dict[str, Score], classes: TargetClasses,
                   val: Split) -> dict:
    """{class: {"targets", "curve": {"1": bpc, ..., "stateful": bpc}, "se": {...}, "state_gain"}}."""
    by_class = {}
    for name, mask in classes.masks().items():
        mask = mask.to(val.ids.device)
        curve, se = {}, {}
        for figure in sorted((f for f in plan.figures if f.name.startswith("curve ")), key=lambda f: f.context):
            point = _point(figure, plan, results, curve, se, mask, val)
            if point is not None:
                curve[str(figure.context)], se[str(figure.context)] = point
        stateful = score_subset(scores[STATEFUL], mask, val)
        curve[STATEFUL], se[STATEFUL] = _figures(stateful)
        gain = paired_difference(stateful, scores[WINDOWED], val)
        gain_bpc, gain_se = _figures(gain)
        by_class[name] = {"targets": int(mask[1:].sum()), "curve": curve, "se": se,
                          "state_gain": {"bpc": gain_bpc, "se": gain_se, "targets": gain.tokens}}
    return by_class


def _kept(result: dict, context) -> Score | None:
    """The pass's Score at `context` (scores.score_at), when it kept its targets."""
    score = score_at(result, context)
    return score if score.positions is not None else None


def _figures(score: Score) -> tuple[float | None, float | None]:
    """(bpc, its standard error); None for what a class too small for it lacks (no target; one target's se)."""
    if not score.tokens:
        return None, None
    return score.bpc, score.bpc_se if math.isfinite(score.bpc_se) else None


def _point(figure, plan: Plan, results, curve: dict, se: dict, mask, val: Split) -> tuple[float, float] | None:
    if len(figure.passes) == 2:  # past seq_len: the class's seq_len point + its paired difference
        reference = _kept(results[figure.passes[0]], plan.seq_len)
        score = _kept(results[figure.passes[1]], figure.context)
        base = str(plan.seq_len)
        if reference is None or score is None or curve.get(base) is None:
            return None
        difference = paired_difference(score_subset(score, mask, val), reference, val)
        if not difference.tokens:
            return None
        spread = None if se[base] is None or not math.isfinite(difference.bpc_se) else math.hypot(difference.bpc_se,
                                                                                                   se[base])
        return curve[base] + difference.bpc, spread
    score = _kept(results[figure.passes[0]], figure.context)
    return None if score is None else _figures(score_subset(score, mask, val))
