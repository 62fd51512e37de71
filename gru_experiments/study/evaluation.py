"""The evaluation as a registry of entries, and its one entry point (docs/evaluation.md).

An entry (plan.Entry) is one kind of figure: the inference modes with the bigram, the context curve
and stateful - windowed (`ModesEntry`, the plan's own passes), the text statistics and the word
validity over training (text_protocol.py), the recall figures (recall.py). `plan_for(request)` builds
the plan of a Request (plan.py) from every entry in ENTRIES; `evaluate(request)` runs it and gives each
entry its results. The end-of-run evaluation, the best checkpoint's, the modes over training,
`sample.py evaluate=true` and the cost estimate all go through these two. A new figure is one entry
appended to ENTRIES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gru_experiments.study.class_curve import curve_by_class
from gru_experiments.study.context_curve import CurvePoint, curve_record, format_curve
from gru_experiments.study.plan import (
    BIGRAM,
    FINAL,
    OVER_TRAINING,
    STATE_GAIN,
    STATEFUL,
    STATELESS,
    WINDOWED,
    Entry,
    Plan,
    Request,
    plan_evaluation,
)
from gru_experiments.study.progress import NO_PROGRESS
from gru_experiments.study.recall import RecallEntry
from gru_experiments.study.scores import Score, Split, paired_difference, score_at
from gru_experiments.study.settings import EvaluationSettings
from gru_experiments.study.target_classes import split_classes
from gru_experiments.study.text_protocol import TextEntry, WordValidityEntry

# What an evaluation reports per mode: each inference mode, the bigram.
FIGURES = (STATEFUL, STATELESS, WINDOWED, BIGRAM)


@dataclass
class ModeEvaluation:
    """The modes' entry's result: every mode's Score, the context curve, stateful - windowed."""
    plan: Plan
    scores: dict[str, Score]  # stateful, stateless, windowed, bigram (those planned)
    curve: dict | None = None  # {"1": bpc, ..., "stateful": bpc, "settings": {...}}
    gain: Score | None = None  # stateful - windowed, paired (paired_difference), warm targets only

    def metrics(self) -> dict:
        """<mode>_nll, <mode>_bpc and <mode>_bpc_se (Score.bpc_se: what separates two models' figures, which
        a whole-split figure has too); state_gain_bpc, state_gain_se: stateful - windowed, paired."""
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


class ModesEntry(Entry):
    """The inference modes, the bigram, the context curve and stateful - windowed: the plan's own passes
    (plan_evaluation), which every evaluation has."""
    name = "modes"

    def run(self, request: Request, plan: Plan, results: list[dict]) -> ModeEvaluation:
        classes = None
        if request.purpose == FINAL and request.tokenizer is not None:  # the curve by kind of target
            longest = max((f.context for f in plan.curve()), default=None)
            classes = split_classes(request.val.ids.cpu(), request.tokenizer, plan.window, longest)
        return score_modes(request.val, plan, results, classes)

    def summary(self, result: ModeEvaluation) -> dict:
        return result.metrics() | {"mode_evaluation": result.settings, "context_curve": result.curve,
                                   "eval_whole_split": result.plan.exact}

    def describe(self, result: ModeEvaluation) -> str:
        return result.describe()


ENTRIES: list[Entry] = [ModesEntry(), TextEntry(), WordValidityEntry(), RecallEntry()]


def plan_for(request: Request) -> Plan:
    """The plan of `request`: the modes' figures its purpose asks for (FINAL: everything; BEST: no
    curve; OVER_TRAINING: stateful and stateless), within its budget, with every entry's units."""
    s: EvaluationSettings = request.settings
    final, training = request.purpose == FINAL, request.purpose == OVER_TRAINING
    tokens = request.training_tokens
    budget = None if s.budget is None or not tokens else math.floor(float(s.budget) * tokens)
    extra = [unit for entry in ENTRIES for unit in entry.units(request)]
    return plan_evaluation(request.model, request.val.n_targets, seq_len=s.seq_len, window=s.window,
                           streams=s.streams, budget=budget, windowed=not training, bigram=not training,
                           curve=final, curve_longest=s.curve_longest, extra=extra)


@dataclass
class Evaluation:
    """Every entry's result of one evaluation (`results`: entry name -> result)."""
    plan: Plan
    results: dict

    @property
    def modes(self) -> ModeEvaluation:
        return self.results["modes"]

    def summary(self) -> dict:
        """Every entry's part of summary.json."""
        out = {}
        for entry in ENTRIES:
            if self.results.get(entry.name) is not None:
                out |= entry.summary(self.results[entry.name])
        return out

    def descriptions(self) -> list[str]:
        """Every entry's lines for the log, an item per entry (the modes' first)."""
        lines = (entry.describe(self.results[entry.name]) for entry in ENTRIES
                 if self.results.get(entry.name) is not None)
        return [line for line in lines if line]


def evaluate(request: Request, plan: Plan | None = None, progress=NO_PROGRESS,
             skip: tuple[str, ...] = ()) -> Evaluation:
    """Every pass of the plan (`plan_for(request)` unless given; the entries in `skip` planned but not
    run: sample.py evaluate=true plans the run's text statistics without drawing them), then each
    entry's result from its own passes' results. `progress`: a bar per pass (progress.py)."""
    plan = plan or plan_for(request)
    request = replace(request, val=request.val.to(request.model.device))
    results = [{} if owner in skip else p.run(request, progress) for p, owner in zip(plan.passes, plan.owners)]
    out = {}
    for entry in ENTRIES:
        own = [r for r, owner in zip(results, plan.owners) if owner == entry.name]
        if entry.name == ModesEntry.name:  # the modes' figures index every pass of the plan
            out[entry.name] = entry.run(request, plan, results)
        elif own and entry.name not in skip:
            out[entry.name] = entry.run(request, plan, own)
    return Evaluation(plan, out)


def score_modes(val: Split, plan: Plan, results: list[dict], classes=None) -> ModeEvaluation:
    """The modes' figures from the results of the plan's passes. With `classes` (target_classes.py) and
    a curve, the curve and stateful - windowed by kind of target too (curve["by_class"])."""
    scores, curve_scores = {}, {}
    for figure in plan.figures:
        if figure.name in FIGURES:
            scores[figure.name] = score_at(results[figure.passes[0]], figure.context)
    for figure in plan.curve():
        curve_scores[figure.context] = _curve_point(figure, results, curve_scores, plan, val)
    curve = curve_record(plan, curve_scores, scores[STATEFUL]) if curve_scores else None
    gain = paired_difference(scores[STATEFUL], scores[WINDOWED], val) if plan.figure(STATE_GAIN) else None
    if classes is not None and curve is not None and gain is not None:
        curve["by_class"] = curve_by_class(plan, results, scores, classes, val)
    return ModeEvaluation(plan, scores, curve, gain)


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
