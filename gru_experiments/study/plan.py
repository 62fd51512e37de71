"""The evaluation's plan: every figure, the passes that score it and their cost, decided before any forward pass;
nothing else derives a stride or a cost. Each kind of pass's `plan` (its cost) and `run` ({context: Score}) stand
side by side; `allocate` applies the budget's rule (docs/evaluation.md#the-plan-and-the-budget).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import ClassVar

from gru_experiments.study.generation import NO_PROGRESS
from gru_experiments.study.modes import MODES, STATEFUL, STATELESS, WINDOWED
from gru_experiments.study.scores import (
    ONE_PASS_CHUNK,
    StatefulChunk,
    chunks_cost,
    congruent,
    score_bigram,
    score_contexts,
    score_stateful,
    score_stateless,
    stream_layout,
    warm_targets,
    window_targets,
)

BIGRAM, TEXT = "bigram", "text"  # figures beside the inference modes (modes.MODES)
STATE_GAIN = "state_gain"  # stateful - windowed, paired target by target
FINAL, BEST, OVER_TRAINING = "final", "best", "over_training"  # which evaluation a Request asks for
# What a figure is (Figure.kind): a mode's (or the bigram's), a curve point, stateful - windowed, another entry's
MODE, CURVE, GAIN, OTHER = "mode", "curve", "gain", "other"


@dataclass(frozen=True)
class Figure:
    """A figure: its context (None: all the history), forward tokens per target (cost), passes (indices)."""
    name: str
    context: int | None
    cost: int
    targets: int
    forward_tokens: int
    passes: tuple[int, ...]
    kind: str = MODE


@dataclass(frozen=True)
class Request:
    """What an evaluation is asked (evaluation.plan_for): the model, the validation split, the settings
    (evaluation.EvaluationSettings), the training tokens the budget is a multiple of, the `purpose`, and
    what some entries need (the tokenizer, the bigram's training ids, the probe, the seed, the index)."""
    model: object
    val: object
    settings: object
    training_tokens: int | None = None
    purpose: str = FINAL
    tokenizer: object = None
    train_ids: object = None
    probe: object = None
    seed: int = 0
    load_text_index: object = None


class Entry:
    """One kind of figure, registered in evaluation.ENTRIES: the passes it asks of the plan (`units`), or the
    stateful pass it reads (`reads_stateful`, `read`), its result from theirs (`run`), its part of summary.json
    and of the log (docs/evaluation.md)."""
    name = "entry"
    reads_every_pass = False  # run given every pass's result (the modes'), not its own passes'

    def units(self, request: Request) -> list["Unit"]:
        return []

    def reads_stateful(self, request: Request) -> bool:
        """Whether it reads every chunk of the stateful figure's pass in this evaluation (`read`), in that pass's
        forward: no pass and no forward tokens of its own."""
        return False

    def read(self, chunk: StatefulChunk):
        """What it keeps of one chunk of the stateful pass (its logits, NLLs, final hidden states), for `run`."""
        raise NotImplementedError

    def run(self, request: Request, plan: "Plan", results: list | None):
        """Its result from its own passes' results (by default: its one pass's); a reader's from what it read of
        every chunk (None where the stateful figure ran windows: a finite-context model's sample)."""
        return results[0][None]

    def summary(self, result) -> dict:
        return {self.name: result}

    def describe(self, result) -> str | None:
        return None


@dataclass(frozen=True)
class Plan:
    passes: tuple[Pass, ...]
    figures: tuple[Figure, ...]
    split_targets: int
    budget: int | None  # forward tokens; None: exact
    window: int  # the windowed mode's context
    seq_len: int
    streams: int
    owners: tuple[str, ...] = ()  # the entry each pass is for

    @property
    def forward_tokens(self) -> int:
        return sum(p.forward_tokens for p in self.passes)

    @property
    def exact(self) -> bool:  # every figure of the modes and the curve scores every target
        return all(f.targets == self.split_targets for f in self.figures if f.kind in (MODE, CURVE))

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def curve(self) -> list[Figure]:
        return sorted((f for f in self.figures if f.kind == CURVE), key=lambda f: f.context)

    def record(self) -> list[dict]:
        """The plan for summary.json: a row per figure."""
        return [{k: v for k, v in asdict(f).items() if k not in ("passes", "kind")} for f in self.figures]

    def read_by(self, readers: tuple[Entry, ...]) -> Plan:
        """The plan with its stateful figure's pass read by `readers` (Entry.read) where that pass is a StatefulPass
        (a finite-context model's sampled stateful figure runs windows); its figures and cost unchanged."""
        figure = self.figure(STATEFUL)
        if not readers or type(self.passes[figure.passes[0]]) is not StatefulPass:
            return self
        passes = list(self.passes)
        passes[figure.passes[0]] = replace(passes[figure.passes[0]], readers=readers)
        return replace(self, passes=tuple(passes))


# --- the passes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pass:
    """A pass: its targets, forward tokens, stride and keep_after (keep each target's NLL: None keeps none);
    each kind's `run(request, progress)` gives {context: result} on request.val with request.model."""
    kind: ClassVar[str] = "pass"
    targets: int = 0
    forward_tokens: int = 0
    stride: int = 1
    keep_after: int | None = None


@dataclass(frozen=True)
class StatefulPass(Pass):
    """`streams` contiguous streams in chunks of `chunk` tokens, the state carried; every stride-th stream,
    whole. keep_after: keep the targets with at least this many tokens of their stream before them;
    readers: the entries that read every chunk (Plan.read_by), their readings in the Score (`readings`)."""
    kind: ClassVar[str] = STATEFUL
    chunk: int = 0
    streams: int = 1
    readers: tuple[Entry, ...] = ()

    @classmethod
    def plan(cls, model, n: int, chunk: int, streams: int, keep_after: int | None, stride: int = 1) -> "StatefulPass":
        streams, length = stream_layout(n, streams)
        forward = len(range(0, streams, stride)) * chunks_cost(model, length, chunk)
        return cls(warm_targets(n, streams, stride, 0), forward, stride, keep_after, chunk, streams)  # all they hold

    @property
    def label(self) -> str:  # its progress bar's
        return STATEFUL + ("" if self.stride == 1 else f", one stream in {self.stride}")

    def run(self, request, progress=NO_PROGRESS) -> dict:
        readings = {reader.name: [] for reader in self.readers}

        def read(chunk: StatefulChunk) -> None:
            for reader in self.readers:
                readings[reader.name].append(reader.read(chunk))
        with progress.phase(self.label, self.targets) as tick:
            score = score_stateful(request.model, request.val, self.chunk, self.streams, targets_after=self.keep_after,
                                   tick=tick, stride=self.stride, read=read if self.readers else None)
        return {None: replace(score, readings=readings) if self.readers else score}


@dataclass(frozen=True)
class WindowsPass(Pass):
    """Every stride-th target from its own window; the same windows give every shorter context in `contexts`."""
    kind: ClassVar[str] = "windows"
    window: int = 0
    contexts: tuple[int, ...] = ()
    targets_by_context: tuple[int, ...] = ()

    @classmethod
    def plan(cls, model, n: int, window: int, contexts, stride: int, keep: bool = False) -> "WindowsPass":
        windows = len(window_targets(n, window, window, stride)[1])
        forward = model.forward_cost(0, min(window, n + 1)) + windows * model.forward_cost(0, window)
        targets = []
        for w in contexts:
            head, _, tail = window_targets(n, window, w, stride)
            forward += len(tail) * model.forward_cost(0, w)
            targets.append(len(head) + windows + len(tail))
        contexts = tuple(contexts)  # `targets`: those of the longest context
        return cls(targets[contexts.index(max(contexts))], forward, stride, 0 if keep else None, window, contexts,
                   tuple(targets))

    def run(self, request, progress=NO_PROGRESS) -> dict:
        n = request.val.n_targets
        label = f"windows of {self.window}" + ("" if self.stride == 1 else f", one target in {self.stride}")
        with progress.phase(label, len(range(1, n + 1, self.stride)) * self.window) as tick:
            return score_contexts(request.model, request.val, self.window, self.contexts, self.stride,
                                  targets=self.keep_after is not None, tick=tick)


@dataclass(frozen=True)
class OnePass(StatefulPass):
    """One stream in chunks of ONE_PASS_CHUNK (scores.score_windowed's): every target from all before it."""
    kind: ClassVar[str] = "one_pass"
    label: ClassVar[str] = "whole context, one pass"

    @classmethod
    def plan(cls, model, n: int, keep: bool) -> "OnePass":
        return super().plan(model, n, ONE_PASS_CHUNK, 1, 0 if keep else None)


@dataclass(frozen=True)
class TablePass(Pass):
    """A first-order table, every target from its previous token: the stateless table (one forward pass over
    the vocabulary) or, `bigram`, the bigram's counting of the training split (nothing runs through the model)."""
    kind: ClassVar[str] = "table"
    bigram: bool = False
    counted: int = 0  # the bigram's: the training tokens it counts first (the estimate prices them)

    def run(self, request, progress=NO_PROGRESS) -> dict:
        return {None: score_bigram(request.train_ids, request.val) if self.bigram
                else score_stateless(request.model, request.val)}


def paired_targets(a: Pass, b: Pass, n: int) -> int:
    """How many targets a stateful figure's pass `a` (its warm ones) and a windowed figure's `b` both scored."""
    stride = math.lcm(*(p.stride if isinstance(p, WindowsPass) else 1 for p in (a, b)))
    if isinstance(a, StatefulPass):  # every a.stride-th stream
        return warm_targets(n, a.streams, a.stride, a.keep_after, stride)
    return len(congruent(1, n, 1, stride))


# --- the curve's points ---------------------------------------------------------------------------
def curve_lengths(context: int | None, seq_len: int, longest: int | None, n: int) -> tuple[list[int], list[int]]:
    """The curve's points up to the training window (1, 2, 4 ... below seq_len, then seq_len) and past it (2, 4,
    8 ... times seq_len up to `longest`, within the split); a finite-context model's stops at the first point that
    holds its whole context."""
    lengths, beyond, w = [2 ** k for k in range((seq_len - 1).bit_length())] + [seq_len], [], 2 * seq_len
    while longest and w <= longest and w < n:
        beyond.append(w)
        w *= 2
    stop = next((w for w in lengths + beyond if context is not None and w >= context), None)
    if stop is None:
        return lengths, beyond
    return [w for w in lengths if w <= stop], [w for w in beyond if w <= stop]


# --- the plan -------------------------------------------------------------------------------------
# The budget's priority: the modes in the study's order, the windowed figure, the text statistics, the
# curve's own passes; an entry's units take a priority among these (Unit.priority).
PRIORITY = {STATEFUL: 10, STATELESS: 20, BIGRAM: 30, WINDOWED: 40, TEXT: 50, "curve": 60, "after": 100}


@dataclass
class Unit:
    """Passes that share one stride: `make(stride)` builds them, `figures(passes, first_index)` names what
    they give; a fixed unit is exact, outside the budget."""
    make: object
    figures: object
    fixed: bool
    most: int | None = None  # the largest stride (None: half the targets, two of them at the least)
    optional: bool = False  # left out (no passes) when even its largest stride does not fit its share
    priority: int = PRIORITY["after"]
    owner: str = "modes"  # the entry it is for
    passes: list[Pass] = field(default_factory=list)

    def cost(self, stride: int) -> int:
        return sum(p.forward_tokens for p in self.make(stride))


def _smallest_stride(unit: Unit, share: float, n: int) -> int:
    """The smallest stride whose passes fit in `share`, at most `most` (default n // 2: two targets)."""
    most = unit.most or max(1, n // 2)
    stride = max(1, min(most, math.ceil(unit.cost(1) / max(share, 1))))
    while stride < most and unit.cost(stride) > share:
        stride += 1
    while stride > 1 and unit.cost(stride - 1) <= share:  # a cost that falls faster than 1/stride (the text's)
        stride -= 1
    return stride


def allocate(units: list[Unit], budget: int | None, n: int) -> None:
    left = budget  # the floor is exact whatever the budget, and not counted against it
    flexible = [u for u in units if not u.fixed]
    for u in units:
        stride = 1
        if not u.fixed and left is not None and u.cost(1) > left:
            # its share: what is left divided among it and the figures' passes after it (an optional
            # unit after it takes only what they leave)
            share = left / (1 + sum(not v.optional for v in flexible[flexible.index(u) + 1:]))
            stride = _smallest_stride(u, share, n)
            if u.optional and u.cost(stride) > share:
                u.passes = []
                continue
        u.passes = list(u.make(stride))
        if left is not None and not u.fixed:
            left -= u.cost(stride)


def figure_of(name: str, context, cost: int, passes, at, index: int, forward: int | None = None,
              kind: str = MODE) -> Figure:
    """A figure from passes[0] (scored at its context `at`) and any others (its forward tokens too)."""
    first = passes[0]
    targets = (dict(zip(first.contexts, first.targets_by_context)).get(at, first.targets)
               if isinstance(first, WindowsPass) else first.targets)
    ids = tuple(range(index, index + len(passes)))
    return Figure(name, context, cost, targets, sum(p.forward_tokens for p in passes) if forward is None
                  else forward, ids, kind)


def plan_evaluation(model, n: int, *, seq_len: int, window: int, streams: int, budget: int | None,
                    windowed: bool = True, bigram: bool | int = True, curve: bool = True,
                    curve_longest: int | None = None, extra: list[Unit] = ()) -> Plan:
    """The plan on a split of `n` targets: stateful and stateless; the windowed figure and the bigram when
    asked (an int: the training tokens it counts); with `curve`, the context curve and stateful - windowed; the
    other entries' `extra` units."""
    units, keep = _units(model, n, seq_len, window, streams, windowed, bigram, curve,
                         *(curve_lengths(model.context, seq_len, curve_longest, n) if curve else ([], [])))
    units = sorted(units + list(extra), key=lambda u: u.priority)
    allocate(units, budget, n)
    passes, figures, owners = [], [], []
    for u in units:
        figures += u.figures(u.passes, len(passes))
        passes += u.passes
        owners += [u.owner] * len(u.passes)
    if keep is not None:
        stateful, windowed_ = (next(f for f in figures if f.name == name) for name in (STATEFUL, WINDOWED))
        figures.append(Figure(STATE_GAIN, None, 0, paired_targets(passes[stateful.passes[0]],
                                                                   passes[windowed_.passes[0]], n),
                              0, stateful.passes + windowed_.passes, GAIN))
    figures.sort(key=_order)
    return Plan(tuple(passes), tuple(figures), n, budget, window, seq_len, max(1, min(streams, n)), tuple(owners))


def _order(f: Figure) -> tuple:
    """Modes first (stateful, stateless, windowed, bigram), then the curve by context, then the rest."""
    names = (*MODES, BIGRAM, TEXT)
    if f.name in names:
        return (0, names.index(f.name))
    return (1, f.context) if f.kind == CURVE else (2, 0)


def _long_figures(long: list[int], passes, i: int) -> list[Figure]:
    """The curve's points past seq_len: the reference pass (passes[0]) counted once, with the first point."""
    return [Figure(f"curve {w}", w, w, q.targets, q.forward_tokens + (passes[0].forward_tokens if j == 0 else 0),
                   (i, i + j + 1), CURVE) for j, (w, q) in enumerate(zip(long, passes[1:]))]


def _units(model, n: int, seq_len: int, window: int, streams: int, windowed: bool, bigram: bool | int, curve: bool,
           lengths: list[int], beyond: list[int]) -> tuple[list[Unit], int | None]:
    """What an evaluation asks of a model: the passes each figure needs, as units for `allocate`, and what
    stateful keeps for stateful - windowed (None: no such figure); the curve's points up to seq_len
    (`lengths`) and past it (`beyond`)."""
    context, cost, p = model.context, model.tokens_per_prediction, PRIORITY
    whole_window = context is not None and context <= window  # a window holds all it sees
    whole = [w for w in lengths + beyond if context is not None and w >= context]  # one at most (curve_lengths)
    short, long = [w for w in lengths if w not in whole], [w for w in beyond if w not in whole]
    # The windowed figure's windows give the short points too; its targets pair with stateful's.
    shares = windowed and not whole_window and window == seq_len
    keep = window if curve and windowed else None

    windows = partial(WindowsPass.plan, model, n)  # (size, contexts, stride, kept)

    def whole_context(stride: int) -> list[Pass]:  # every target from all the model can see: one pass, or windows
        return [OnePass.plan(model, n, keep=curve) if stride == 1 else windows(context, [context], stride, curve)]

    def stateful(stride: int) -> list[Pass]:
        """A finite-context model's every stride-th target from its context; a recurrent one's streams."""
        if stride == 1 or context is None:
            return [StatefulPass.plan(model, n, seq_len, streams, keep, stride)]
        return [windows(context, [context], stride, keep is not None)]

    def windowed_passes(stride: int) -> list[Pass]:
        if whole_window:
            return whole_context(stride)
        return [windows(window, sorted({window, *short}) if shares else [window], stride, curve)]

    def windowed_figures(passes, i) -> list[Figure]:
        at = context if whole_window else window
        figures = [figure_of(WINDOWED, at, min(window, cost) if whole_window else window, passes, at, i)]
        shared = (short if shares else []) + (whole if whole_window else [])
        return figures + [point(w, min(w, cost) if w in whole else w, passes, w, i, 0) for w in shared]

    def point(w: int, w_cost: int, passes, at, i: int, forward: int | None = None) -> Figure:
        return figure_of(f"curve {w}", w, w_cost, passes, at, i, forward, CURVE)

    most = max(1, min(streams, n)) if context is None else None  # a recurrent model's sample
    units = [Unit(stateful, lambda ps, i: [figure_of(STATEFUL, None, cost, ps, context, i)], False, most,
                  priority=p[STATEFUL]),
             Unit(lambda s: [TablePass(n, model.vocab_size)],
                  lambda ps, i: [figure_of(STATELESS, 1, 0, ps, None, i)], True, priority=p[STATELESS])]
    if bigram:
        units.append(Unit(lambda s: [TablePass(n, bigram=True, counted=int(bigram))],
                          lambda ps, i: [figure_of(BIGRAM, 1, 0, ps, None, i)], True, priority=p[BIGRAM]))
    if windowed:
        units.append(Unit(windowed_passes, windowed_figures, whole_window and cost == 1, priority=p[WINDOWED]))
    if short and not shares:  # the pass counted once, with the longest point
        units.append(Unit(lambda s: [windows(max(short), short, s, curve)],
                          lambda ps, i: [point(w, w, ps, w, i, None if w == max(short) else 0) for w in short],
                          False, priority=p["curve"]))
    if whole and not (windowed and whole_window):
        units.append(Unit(whole_context, lambda ps, i: [point(w, cost, ps, None, i) for w in whole], cost == 1,
                          priority=p["curve"]))
    if long:  # a reference pass at seq_len, then one per point; optional: it takes what the figures before it leave
        units.append(Unit(lambda s: [windows(w, [w], s, True) for w in (seq_len, *long)],
                          partial(_long_figures, long), False, optional=True, priority=p["curve"]))
    return units, keep
