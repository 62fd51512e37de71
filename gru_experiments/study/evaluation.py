"""The evaluation as a registry of entries (ENTRIES: a new figure is one entry appended, docs/evaluation.md) and
its entry points, `plan_for(request)` and `evaluate(request)`, which every evaluation and the cost estimate go
through; the settings it is built from and the context curve's record.
"""

import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, ClassVar

import torch
from torch import Tensor

from gru_experiments.errors import UserError
from gru_experiments.study.cache import CacheEntry
from gru_experiments.study.dynamic import DynamicSettings
from gru_experiments.study.dynamic_figure import DynamicEntry
from gru_experiments.study.generation import NO_PROGRESS
from gru_experiments.study.modes import DYNAMIC, MODES, STATEFUL, WINDOWED
from gru_experiments.study.plan import (
    BIGRAM,
    FINAL,
    OVER_TRAINING,
    STATE_GAIN,
    Entry,
    Plan,
    Request,
    plan_evaluation,
)
from gru_experiments.study.recall import RecallEntry
from gru_experiments.study.scores import Score, Split, paired_difference, score_at, score_subset
from gru_experiments.study.target_classes import TargetClasses, split_classes
from gru_experiments.study.text_protocol import TextEntry, TextSettings, WordValidityEntry
from gru_experiments.validation import Rule, check_rules, int_at_least, positive_number, temperature_rule

# What an evaluation reports per mode: each inference mode, the bigram.
FIGURES = (*MODES, BIGRAM)


# --- the evaluation's settings, each part a frozen dataclass holding its rules (defaults: conf/evaluation/
# default.yaml), built once per run from the checked config; a bad value is one UserError naming the key
def _from(cls, node, prefix: str, **more):
    check_rules(node, [], prefix, known=[rule.key for rule in cls.RULES])
    return cls(**node, **more)


@dataclass(frozen=True)
class SampleConfig:
    """evaluation.samples: the side-by-side samples, about `chars` characters per prompt at `temperature`."""
    chars: int
    temperature: float
    RULES: ClassVar = [Rule("chars", int_at_least(1), "an integer >= 1"), temperature_rule("temperature")]

    def __post_init__(self):
        check_rules(self.__dict__, self.RULES, "evaluation.samples.")


# The evaluation group's defaults, for a run that recorded none (a bare checkpoint) and to tell what a command changed
DEFAULT_EVALUATION = Path(__file__).resolve().parents[2] / "conf" / "evaluation" / "default.yaml"


SPLITS = ("validation", "test")


@dataclass(frozen=True)
class EvaluationSettings:
    """The evaluation group for a model trained on windows of `seq_len` (budget: forward tokens per training
    token, None: exact; window: the windowed mode's, None in the config: seq_len)."""
    seq_len: int
    budget: float | None
    window: int
    streams: int
    curve_longest: int | None
    text: TextSettings
    samples: SampleConfig
    dynamic: DynamicSettings
    split: str = "validation"  # the split the end-of-run evaluation scores: "test" only when asked
    RULES: ClassVar = [
        Rule("streams", int_at_least(1), "an integer >= 1"),
        Rule("window", int_at_least(1), "null (the training data.seq_len) or an integer >= 1", optional=True),
        Rule("budget", positive_number, "null (every figure exact) or a number > 0 (forward tokens per token "
             "trained)", optional=True),
        Rule("curve_longest", int_at_least(1), "null (the curve stops at data.seq_len) or an integer >= 1",
             optional=True),
        *(Rule(part, lambda v: hasattr(v, "keys"), "a mapping") for part in ("text", "samples")),
        Rule("dynamic", lambda v: hasattr(v, "keys"), "a mapping", may_be_absent=True),
        Rule("split", lambda v: v in SPLITS, " or ".join(SPLITS) + " (test: the corpus's test split, scored only "
             "when asked)", may_be_absent=True)]

    @classmethod
    def of(cls, evaluation, seq_len: int) -> "EvaluationSettings":
        e = evaluation  # a config group, checked
        check_rules(e, cls.RULES, "evaluation.", known=[rule.key for rule in cls.RULES])
        window = int(e["window"] or seq_len)
        return cls(int(seq_len), e["budget"], window, int(e["streams"]), e["curve_longest"],
                   _from(TextSettings, e["text"], "evaluation.text.", window=window),
                   _from(SampleConfig, e["samples"], "evaluation.samples."),
                   DynamicSettings.of(e.get("dynamic"), DEFAULT_EVALUATION), e.get("split") or "validation")

    def check_window(self, targets: int) -> None:
        """train.py's and sample.py's check that the window is shorter than the validation split (`targets`)."""
        if self.window >= targets:
            raise UserError(f"evaluation.window={self.window:,} is not shorter than the validation split ({targets:,} "
                            "targets): no target has that much context before it, so the windowed figures would "
                            f"measure nothing; set evaluation.window below {targets:,}, or null (the training "
                            "data.seq_len)")

    def check_streams(self, targets: int) -> None:
        """Refuses streams >= targets: each stream would be one target from a zero state, stateful the stateless."""
        if self.streams >= targets > 1:
            raise UserError(f"evaluation.streams={self.streams:,} is not below the validation split's {targets:,} "
                            "targets: each stream would hold one target, scored from a zero state, so the stateful "
                            f"figures would be the stateless ones; set evaluation.streams below {targets:,} (the "
                            "state is carried along each stream, of targets / streams tokens; the default is 64)")


@dataclass
class ModeEvaluation:
    """The modes' entry's result: every mode's Score, the context curve, stateful - windowed."""
    plan: Plan
    scores: dict[str, Score]  # stateful, stateless, windowed, bigram (those planned)
    curve: dict | None = None  # {"1": bpc, ..., "stateful": bpc, "settings": {...}}
    gain: Score | None = None  # stateful - windowed, paired (paired_difference), warm targets only

    def metrics(self) -> dict:
        """<mode>_nll, <mode>_bpc, <mode>_bpc_se; state_gain_bpc, state_gain_se: stateful - windowed, paired."""
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
        return (f"stateful - windowed ({self.plan.window} tokens) not measured: paired on {self.gain.tokens} "
                "target(s), fewer than the 2 a standard error needs; the modes scored too few targets in common "
                f"(a windowed target needs {self.plan.window} tokens before it, a sampled plan scores only some): a "
                "longer validation split, a shorter evaluation.window or a larger evaluation.budget")

    @property
    def settings(self) -> dict:
        """What was scored, for summary.json ("mode_evaluation"), with the plan (a row per figure)."""
        plan, windowed = self.plan, self.scores.get(WINDOWED)
        settings = {"seq_len": plan.seq_len, "streams": plan.streams, "window": plan.window, "budget": plan.budget,
                    "split_targets": plan.split_targets, "forward_tokens": plan.forward_tokens}
        if windowed is not None:
            figure = plan.figure(WINDOWED)
            settings |= {"windowed_stride": plan.passes[figure.passes[0]].stride, "windowed_targets": windowed.tokens,
                         "windowed_bpc_se": windowed.sampling_se}
        return settings | {"plan": plan.record()}

    def describe(self) -> str:
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
        if self.curve is not None:  # every point's settings: curve_record's
            settings = self.curve["settings"]
            lines += ["context curve (bits per character against the tokens of context):",
                      f"{'context':>8} {'bits/char':>10} {'targets':>9} {'stride':>7} {'s.e.':>8}"]
            for key, bpc in curve_points(self.curve):
                se = settings["bpc_se"][key]
                lines.append(f"{key:>8} {bpc:>10.4f} {settings['targets'][key]:>9,} {settings['stride'][key]:>7} "
                             f"{'exact' if not se else f'{se:.4f}':>8}")
        return "\n".join(lines)


class ModesEntry(Entry):
    """The modes, the bigram, the context curve and stateful - windowed: the plan's own passes."""
    name = "modes"
    reads_every_pass = True  # its figures index every pass of the plan

    def run(self, request: Request, plan: Plan, results: list[dict]) -> ModeEvaluation:
        classes = None
        if request.purpose == FINAL and request.tokenizer is not None:  # the curve by kind of target
            longest = max((f.context for f in plan.curve()), default=None)
            classes = partial(split_classes, request.val.ids.cpu(), request.tokenizer, plan.window, longest)
        return score_modes(request.val, plan, results, classes)

    def summary(self, result: ModeEvaluation) -> dict:
        return result.metrics() | {"mode_evaluation": result.settings, "context_curve": result.curve,
                                   "eval_whole_split": result.plan.exact}

    describe = staticmethod(ModeEvaluation.describe)


ENTRIES: list[Entry] = [ModesEntry(), CacheEntry(), TextEntry(), WordValidityEntry(), RecallEntry(), DynamicEntry()]


def register_entry(entry: Entry) -> Entry:
    """Add a figure at the end of ENTRIES. Its name keys its results and its summary: a name taken is refused, as
    a report section's is (report.register_section)."""
    if any(known.name == entry.name for known in ENTRIES):
        raise ValueError(f"evaluation entry {entry.name!r}: the name is taken")
    ENTRIES.append(entry)
    return entry


def plan_for(request: Request) -> Plan:
    """The plan of `request` (FINAL: everything; BEST: no curve; OVER_TRAINING: stateful and stateless; no bigram
    without the training ids)."""
    s = request.settings  # EvaluationSettings
    final, training = request.purpose == FINAL, request.purpose in (OVER_TRAINING, DYNAMIC)
    tokens = request.training_tokens
    budget = None if s.budget is None or not tokens else math.floor(float(s.budget) * tokens)
    extra = [unit for entry in ENTRIES for unit in entry.units(request)]
    # the bigram is counted from the training split: without its ids (a text scored alone) there is none
    plan = plan_evaluation(request.model, request.val.n_targets, seq_len=s.seq_len, window=s.window,
                           streams=s.streams, budget=budget, windowed=not training,
                           bigram=not training and request.train_ids is not None and max(len(request.train_ids), 1),
                           curve=final, curve_longest=s.curve_longest, extra=extra)
    return plan.read_by(tuple(entry for entry in ENTRIES if entry.reads_stateful(request)))  # its cost unchanged


@dataclass
class Evaluation:
    """Every entry's result of one evaluation (`results`: entry name -> result)."""
    plan: Plan
    results: dict

    @property
    def modes(self) -> ModeEvaluation:
        return self.results["modes"]

    def _reported(self) -> list[tuple]:  # (entry, its result) for each entry with one, in ENTRIES' order
        return [(entry, self.results[entry.name]) for entry in ENTRIES if self.results.get(entry.name) is not None]

    def summary(self) -> dict:
        return {key: value for entry, result in self._reported() for key, value in entry.summary(result).items()}

    def descriptions(self) -> list[str]:
        """Every entry's lines for the log (the modes' first)."""
        return [line for entry, result in self._reported() if (line := entry.describe(result))]


def evaluate(request: Request, plan: Plan | None = None, progress=NO_PROGRESS,
             skip: tuple[str, ...] = ()) -> Evaluation:
    """Every pass of the plan (the entries in `skip` planned, not run), then each entry's result."""
    plan = plan or plan_for(request)
    request = replace(request, val=request.val.to(request.model.device))
    results = [{} if owner in skip else p.run(request, progress) for p, owner in zip(plan.passes, plan.owners)]
    # what each reader read of every chunk of the stateful pass (Plan.read_by), by name; {}: none read it
    readings = getattr(results[plan.figure(STATEFUL).passes[0]].get(None), "readings", None) or {}
    out = {}
    for entry in ENTRIES:
        own = [r for r, owner in zip(results, plan.owners) if owner == entry.name]
        if entry.reads_every_pass:
            out[entry.name] = entry.run(request, plan, results)
        elif entry.reads_stateful(request) and entry.name not in skip:
            out[entry.name] = entry.run(request, plan, readings.get(entry.name))
        elif own and entry.name not in skip:
            out[entry.name] = entry.run(request, plan, own)
    return Evaluation(plan, out)


def score_modes(val: Split, plan: Plan, results: list[dict],
                classes: Callable[[Tensor], TargetClasses] | None = None) -> ModeEvaluation:
    """The modes' figures from the plan's passes' results; with `classes` (of the targets the figures kept: a
    sampled plan's classes cost its sample, not the split), the curve by kind of target too."""
    scores = {f.name: score_at(results[f.passes[0]], f.context) for f in plan.figures if f.name in FIGURES}
    curve_scores = {}
    for figure in plan.curve():  # in order: a point past seq_len builds on the seq_len point
        curve_scores[figure.context] = _curve_point(figure, results, curve_scores, plan, val)
    curve = curve_record(plan, curve_scores, scores[STATEFUL]) if curve_scores else None
    gain = paired_difference(scores[STATEFUL], scores[WINDOWED], val) if plan.figure(STATE_GAIN) else None
    if classes is not None and curve is not None and gain is not None:
        curve["by_class"] = curve_by_class(plan, results, scores, classes(_kept(plan, results, scores)), val)
    return ModeEvaluation(plan, scores, curve, gain)


def _kept(plan: Plan, results: list[dict], scores: dict[str, Score]) -> Tensor:
    """The targets the figures by kind of target read: stateful's, windowed's and every curve point's."""
    kept = [scores[STATEFUL].positions, scores[WINDOWED].positions]
    for figure in plan.curve():
        kept += [s.positions for s in _point_scores(figure, plan, results) if s is not None]
    return torch.unique(torch.cat([k.cpu() for k in kept if k is not None] or [torch.zeros(0, dtype=torch.long)]))


def _point_scores(figure, plan: Plan, results: list[dict]) -> tuple[Score, Score | None]:
    """A curve point's Score and, past seq_len, its reference pass's at seq_len (None up to seq_len): such a
    point is the seq_len point plus its paired difference from the reference, so its error is the difference's
    alone (docs/evaluation.md)."""
    if len(figure.passes) == 2:  # (the reference pass at seq_len, this point's own)
        return results[figure.passes[1]][figure.context], results[figure.passes[0]][plan.seq_len]
    return score_at(results[figure.passes[0]], figure.context), None


def _curve_point(figure, results, done: dict, plan: Plan, val: Split) -> tuple:
    """A point of the context curve (curve_record's), `done` holding the points before it."""
    score, reference = _point_scores(figure, plan, results)
    stride = plan.passes[figure.passes[-1]].stride
    if reference is None:
        return score.bpc, score.sampling_se, score.tokens, stride, figure.forward_tokens
    (base, base_se, *_), difference = done[plan.seq_len], paired_difference(score, reference, val)
    return (base + difference.bpc, math.hypot(difference.sampling_se, base_se), score.tokens, stride,
            figure.forward_tokens)


# --- the context curve (bits per character given only the last w tokens, docs/evaluation.md): its record in
# summary.json (its table: ModeEvaluation.describe); which points, and at what cost, is the plan's (plan.py)
def curve_record(plan, points: dict[int, tuple], stateful) -> dict:
    """{"1": bpc, ..., "stateful": bpc, "settings": per point its targets, stride, forward tokens and s.e.}
    from `points`, {context: (bpc, its sampling error (0: exact), targets, stride, the forward tokens of its
    own pass (0: it came with another figure's))}."""
    fields = ("bpc", "bpc_se", "targets", "stride", "forward_tokens")  # of a point's tuple
    column = {name: {str(w): point[i] for w, point in sorted(points.items())} for i, name in enumerate(fields)}
    settings = {"max_window": plan.seq_len, "split_targets": plan.split_targets, "budget": plan.budget,
                "longest": max(points), "targets": column["targets"] | {STATEFUL: stateful.tokens},
                "stride": column["stride"] | {STATEFUL: 1}, "forward_tokens": column["forward_tokens"],
                "bpc_se": column["bpc_se"] | {STATEFUL: stateful.sampling_se}}
    return column["bpc"] | {STATEFUL: stateful.bpc, "settings": settings}


def curve_points(curve: dict | None) -> list[tuple[str, float]]:
    """The (context, bpc) points of a summary's context_curve, in order, without its settings."""
    if not isinstance(curve, dict):
        return []
    return [(key, value) for key, value in curve.items()
            if key != "settings" and isinstance(value, (int, float)) and math.isfinite(value)]


# --- the context curve and stateful - windowed by kind of target (docs/evaluation.md) -----------------
def curve_by_class(plan: Plan, results: list[dict], scores: dict[str, Score], classes: TargetClasses,
                   val: Split) -> dict:
    """{class: {"targets", "curve": {"1": bpc, ..., "stateful": bpc}, "se": {...}, "state_gain"}}: each figure
    recomputed on one class's targets from the NLLs its passes kept; "se": the standard error of its mean."""
    by_class = {}
    for name, mask in classes.masks():
        mask = mask.to(val.ids.device)
        curve, se, targets = {}, {}, int(mask[1:].count_nonzero())  # counted once (a bool sum widens to int64)
        for figure in plan.curve():
            point = _point(figure, plan, results, curve, se, mask, targets, val)
            if point is not None:
                curve[str(figure.context)], se[str(figure.context)] = point
        stateful = score_subset(scores[STATEFUL], mask, val, targets)
        curve[STATEFUL], se[STATEFUL] = _figures(stateful)
        gain = paired_difference(stateful, scores[WINDOWED], val)
        gain_bpc, gain_se = _figures(gain)
        by_class[name] = {"targets": targets, "curve": curve, "se": se,
                          "state_gain": {"bpc": gain_bpc, "se": gain_se, "targets": gain.tokens}}
    return by_class


def _figures(score: Score) -> tuple[float | None, float | None]:
    """(bpc, its standard error); None for what a class too small for it lacks (no target; one target's se)."""
    if not score.tokens:
        return None, None
    return score.bpc, score.bpc_se if math.isfinite(score.bpc_se) else None


def _point(figure, plan: Plan, results, curve: dict, se: dict, mask, targets: int,
           val: Split) -> tuple[float, float] | None:
    """A curve point on one class's targets (curve_by_class's); None where its passes kept no targets."""
    score, reference = _point_scores(figure, plan, results)
    if score.positions is None or (reference is not None and reference.positions is None):
        return None
    if reference is None:
        return _figures(score_subset(score, mask, val, targets))
    base = str(plan.seq_len)  # past seq_len: the class's seq_len point + its paired difference
    difference = paired_difference(score_subset(score, mask, val, targets), reference, val)
    if curve.get(base) is None or not difference.tokens:
        return None
    spread = None if se[base] is None or not math.isfinite(difference.bpc_se) else math.hypot(difference.bpc_se,
                                                                                               se[base])
    return curve[base] + difference.bpc, spread
