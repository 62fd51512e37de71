"""Running an evaluation's plan (plan.py) on the validation split: every inference mode, the bigram
baseline, the context curve and stateful - windowed, each figure as the plan says (docs/evaluation.md).
The `evaluation` config group's settings become a plan in `plan_for`; `evaluate` runs any plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from gru_experiments.study.class_curve import curve_by_class
from gru_experiments.study.context_curve import CurvePoint, curve_record, format_curve
from gru_experiments.study.plan import (
    BIGRAM,
    STATE_GAIN,
    STATEFUL,
    STATELESS,
    TEXT,
    WINDOWED,
    Pass,
    Plan,
    plan_evaluation,
)
from gru_experiments.study.progress import NO_PROGRESS
from gru_experiments.study.scores import (
    Score,
    Split,
    paired_difference,
    score_at,
    score_bigram,
    score_contexts,
    score_in_one_pass,
    score_stateful,
    score_stateless,
)
from gru_experiments.study.target_classes import TargetClasses

# What an evaluation reports per mode: each inference mode, the bigram.
FIGURES = (STATEFUL, STATELESS, WINDOWED, BIGRAM)


@dataclass
class Evaluation:
    plan: Plan
    scores: dict[str, Score]  # stateful, stateless, windowed, bigram (those planned)
    curve: dict | None = None  # {"1": bpc, ..., "stateful": bpc, "settings": {...}}
    gain: Score | None = None  # stateful - windowed, paired (paired_difference), warm targets only

    def metrics(self) -> dict:
        """<mode>_nll, <mode>_bpc and <mode>_bpc_se: the standard error of the bpc as a mean over the
        targets scored, taken as independent draws from text like the split's (Score.bpc_se). It is
        what separates two models' figures (finding 7), not a sampling error: a whole-split figure has
        it too. And state_gain_bpc, state_gain_se: stateful - windowed, paired."""
        metrics = {}
        for mode, score in self.scores.items():
            metrics |= {f"{mode}_nll": score.nll, f"{mode}_bpc": score.bpc, f"{mode}_bpc_se": score.bpc_se}
        if self.gain is not None:
            n = self.gain.tokens
            metrics["state_gain_bpc"], metrics["state_gain_se"] = (self.gain.bpc if n else None), self.gain.bpc_se
            if n < 2:
                metrics["state_gain_note"] = self.gain_note
        return metrics

    @property
    def gain_note(self) -> str:
        """Why stateful - windowed has no figure, or no standard error: too few targets in common."""
        return (f"stateful - windowed ({self.plan.window} tokens) not measured: paired on {self.gain.tokens} "
                "target(s), fewer than the 2 a standard error needs; the modes scored too few targets in common "
                f"(a windowed target needs {self.plan.window} tokens before it, a sampled plan scores only some): a "
                "longer validation split, a shorter evaluation.window or a larger evaluation.budget")

    @property
    def settings(self) -> dict:
        """What was scored, for summary.json ("mode_evaluation"): the settings, the windowed figure's
        sample, the forward tokens run and the plan (a row per figure)."""
        plan, windowed = self.plan, self.scores.get(WINDOWED)
        settings = {"seq_len": plan.seq_len, "streams": plan.streams, "window": plan.window, "budget": plan.budget,
                    "split_targets": plan.split_targets, "forward_tokens": plan.forward_tokens}
        if windowed is not None:
            figure = plan.figure(WINDOWED)
            settings |= {"windowed_stride": plan.passes[figure.passes[0]].stride, "windowed_targets": windowed.tokens,
                         "windowed_bpc_se": windowed.sampling_se}
        return settings | {"plan": plan.record()}

    def describe(self) -> str:
        """For the log: what was scored, every mode, stateful - windowed and the curve."""
        plan, gain = self.plan, self.gain
        scored = "the whole validation split" if plan.exact else (
            f"a plan within evaluation.budget ({plan.budget:,} forward tokens; sampled figures carry their "
            "standard errors)")
        lines = [f"inference modes on {scored}, {plan.forward_tokens:,} forward tokens:",
                 f"{'mode':<10} {'nats/token':>10} {'bits/char':>10} {'targets':>9}"]
        lines += [f"{mode:<10} {s.nll:>10.4f} {s.bpc:>10.4f} {s.tokens:>9,}" for mode, s in self.scores.items()]
        if gain is not None:
            lines.append(f"stateful - windowed ({plan.window} tokens), paired on {gain.tokens:,} targets: "
                         f"{gain.bpc:+.4f} ± {gain.bpc_se:.4f} bits/char" if gain.tokens > 1 else self.gain_note)
        if self.curve is not None:
            lines.append("context curve (bits per character against the tokens of context):\n"
                         + format_curve(self.curve))
        return "\n".join(lines)


def plan_for(model, n_targets: int, seq_len: int, settings, training_tokens: int | None, **figures) -> Plan:
    """The plan an `evaluation` config group asks for (conf/evaluation/default.yaml): budget forward
    tokens per training token (None: exact), the windowed mode's window (None: seq_len), the streams,
    the curve's longest point. `figures`: plan_evaluation's windowed, bigram, curve."""
    ratio = settings.get("budget")
    budget = None if ratio is None or not training_tokens else math.floor(float(ratio) * training_tokens)
    return plan_evaluation(model, n_targets, seq_len=seq_len, window=evaluation_window(settings, seq_len),
                           streams=int(settings.get("streams", 64)), budget=budget,
                           curve_longest=settings.get("curve_longest"), **figures)


def evaluation_window(settings, seq_len: int) -> int:
    """The windowed mode's context: evaluation.window (the one key, for scoring and sampling),
    null meaning the training window data.seq_len."""
    return int(settings.get("window") or seq_len)


def evaluate(model, train_ids: Tensor, val: Split, plan: Plan, progress=NO_PROGRESS,
             classes: TargetClasses | None = None) -> Evaluation:
    """Every pass of `plan`, then its figures. `progress`: a bar per pass (progress.py). With `classes`
    (target_classes.py) and a curve, the curve and stateful - windowed by kind of target too
    (curve["by_class"])."""
    val = val.to(model.device)
    results = [run_pass(model, train_ids, val, p, progress) for p in plan.passes]
    scores, curve_scores = {}, {}
    for figure in plan.figures:
        first = results[figure.passes[0]] if figure.passes else {}
        if figure.name in FIGURES:
            scores[figure.name] = score_at(first, figure.context)
        elif figure.name.startswith("curve "):
            curve_scores[figure.context] = _curve_point(figure, results, curve_scores, plan, val)
    curve = curve_record(plan, curve_scores, scores[STATEFUL]) if curve_scores else None
    gain = paired_difference(scores[STATEFUL], scores[WINDOWED], val) if plan.figure(STATE_GAIN) else None
    if classes is not None and curve is not None and gain is not None:
        curve["by_class"] = curve_by_class(plan, results, scores, classes, val)
    return Evaluation(plan, scores, curve, gain)


def run_pass(model, train_ids: Tensor, val: Split, p: Pass, progress=NO_PROGRESS) -> dict:
    """{context: Score} of one pass (context None: the pass's one figure)."""
    n, keep = val.n_targets, p.keep_after is not None
    if p.kind == TEXT:  # the text statistics' samples: drawn by the caller (runs/scoring.py), as the plan cut them
        return {}
    if p.kind == "vocabulary":
        return {None: score_stateless(model, val)}
    if p.kind == "count":
        return {None: score_bigram(train_ids, val)}
    if p.kind == "stateful":
        with progress.phase("stateful" + ("" if p.stride == 1 else f", one stream in {p.stride}"), p.targets) as tick:
            return {None: score_stateful(model, val, p.window, p.streams, targets_after=p.keep_after, tick=tick,
                                         stride=p.stride)}
    if p.kind == "one_pass":
        with progress.phase("whole context, one pass", n) as tick:
            return {None: score_in_one_pass(model, val, targets=keep, tick=tick)}
    label = f"windows of {p.window}" + ("" if p.stride == 1 else f", one target in {p.stride}")
    with progress.phase(label, len(range(1, n + 1, p.stride)) * p.window) as tick:
        return score_contexts(model, val, p.window, p.contexts, p.stride, targets=keep, tick=tick)


def _curve_point(figure, results, done: dict, plan: Plan, val: Split) -> CurvePoint:
    """A point of the context curve. A point past seq_len is a difference estimate: the seq_len point
    plus its paired difference from a reference pass at seq_len on the same targets, so its error
    is the difference's alone (docs/evaluation.md)."""
    own = plan.passes[figure.passes[-1]]
    if len(figure.passes) == 2:  # (the reference pass at seq_len, this point's own)
        base, reference = done[plan.seq_len], results[figure.passes[0]][plan.seq_len]
        score = results[figure.passes[1]][figure.context]
        difference = paired_difference(score, reference, val)
        return CurvePoint(base.bpc + difference.bpc, math.hypot(difference.sampling_se, base.se), score.tokens,
                          own.stride, figure.forward_tokens)
    score = score_at(results[figure.passes[0]], figure.context)
    return CurvePoint(score.bpc, score.sampling_se, score.tokens, own.stride, figure.forward_tokens)
