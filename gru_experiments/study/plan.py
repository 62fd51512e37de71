"""The evaluation's plan: every figure an evaluation reports, the passes over the validation split
that score them, and what each costs, decided before any forward pass (docs/evaluation.md).

`plan_evaluation` is a pure function of the model's shape (its context and `forward_cost`), the
split's size and the settings. Everything that scores (the end-of-run evaluation, the modes at every
validation, `sample.py evaluate=true`) executes a plan (evaluation.py), and the cost estimate sums
one (runs/estimate.py): nothing else derives a stride or a cost.

The budget: forward tokens (tokens run through the model) the evaluation may spend. The stateless
table and the bigram's counting (the floor: a pass over the vocabulary, and none) are always exact,
outside it; so is the one pass of a model that sees no more than a window at a token per target
(the MLP, the n-gram). The others come in the study's order: the stateful figure (a token per target,
a block per target for a transformer past its block), the windowed figure with every curve point its
windows give (a window per target), the curve's own points, the points past the training window.
Each is exact when its exact cost fits in what the budget has left; else it scores a systematic
sample, the smallest within its share (what is left divided among it and the passes after it, the
text statistics' aside: they take only what the others leave): every
k-th target, or for a recurrent model's stateful figure every k-th stream, whole (its state needs
the stream's history). budget None: everything exact. The text statistics' samples (a TextDemand)
come after the windowed figure, before the curve's own passes: every k-th sample, two at the least,
the drift only when exact; left out when even two samples do not fit their share.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

STATEFUL, STATELESS, WINDOWED, BIGRAM, TEXT = "stateful", "stateless", "windowed", "bigram", "text"
STATE_GAIN = "state_gain"  # stateful - windowed, paired target by target
ONE_PASS_CHUNK = 1 << 12  # a one-stream pass runs the split in chunks of this many tokens (scores.score_in_one_pass)


@dataclass(frozen=True)
class Pass:
    """One pass of the model over the split (executed by evaluation.run_pass).

    kind: stateful (`streams` contiguous streams in chunks of `window`, the state carried), one_pass
    (one stream, the state carried: a finite-context model's whole context), windows (every target
    from its own window of `window` tokens, from the initial state, which also gives every shorter
    context in `contexts`), vocabulary (the stateless table) or count (the bigram's counting)."""
    kind: str  # or text (the text statistics' samples: `targets` of them, `drift` long generations)
    window: int = 0
    contexts: tuple[int, ...] = ()
    stride: int = 1
    streams: int = 1
    keep_after: int | None = None  # keep the NLL of each target (for a paired difference): stateful, those
    #                                 with at least this many tokens of their stream before them; windows: all
    targets: int = 0  # targets scored (windows: at its longest context)
    forward_tokens: int = 0
    targets_by_context: tuple[int, ...] = ()  # windows: the targets of each of `contexts`
    drift: int = 0  # text: the long generations measured stretch by stretch


@dataclass(frozen=True)
class TextDemand:
    """What the text statistics ask (study/text_protocol.py): `samples` per mode x decoder and `drift`
    long generations; `cost(samples, drift)`: the forward tokens of drawing them."""
    samples: int
    drift: int
    cost: object

    def make(self, stride: int) -> list[Pass]:
        """Every stride-th sample (one at the least); the drift only when exact."""
        samples, drift = -(-self.samples // stride), self.drift if stride == 1 else 0
        return [Pass(TEXT, targets=samples, drift=drift, forward_tokens=self.cost(samples, drift))]


@dataclass(frozen=True)
class Figure:
    """A figure the evaluation reports. context: tokens of context it gives the model (None: all the
    history); cost: forward tokens per target; passes: the indices in Plan.passes it comes from."""
    name: str
    context: int | None
    cost: int
    targets: int
    forward_tokens: int
    passes: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    passes: tuple[Pass, ...]
    figures: tuple[Figure, ...]
    split_targets: int
    budget: int | None  # forward tokens; None: exact
    window: int  # the windowed mode's context
    seq_len: int
    streams: int

    @property
    def forward_tokens(self) -> int:
        return sum(p.forward_tokens for p in self.passes)

    @property
    def exact(self) -> bool:
        """Every figure scores every target of the split."""
        return all(f.targets == self.split_targets for f in self.figures if f.name not in (STATE_GAIN, TEXT))

    @property
    def text(self) -> Pass | None:
        """The text statistics' pass, when planned."""
        return next((p for p in self.passes if p.kind == TEXT), None)

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def record(self) -> list[dict]:
        """The plan for summary.json: a row per figure."""
        return [{k: v for k, v in asdict(f).items() if k != "passes"} for f in self.figures]


# --- the geometry of each pass: what scores.py runs, counted without running it -----------------
def congruent(low: int, high: int, residue: int, stride: int) -> int:
    """How many integers u in [low, high] have u = residue (mod stride)."""
    if high < low:
        return 0
    first = low + (residue - low) % stride
    return 0 if first > high else (high - first) // stride + 1


def windows_pass(model, n: int, window: int, contexts, stride: int, keep: bool = False) -> Pass:
    """scores.score_contexts: the prefix ids[:window] in one call, a window of `window` tokens for every
    stride-th target past it, and each shorter context's last targets from their own w tokens."""
    def shift(w: int) -> int:  # context w scores the targets u = shift(w) (mod stride)
        return w + 1 - window

    windows = congruent(1, n - window, 1 - window, stride)
    forward = model.forward_cost(0, min(window, n + 1)) + windows * model.forward_cost(0, window)
    targets = {}
    for w in contexts:
        tail_from = min(max(n - window + w, w), n) + 1
        tail = congruent(tail_from, n, shift(w), stride)
        forward += tail * model.forward_cost(0, w)
        targets[w] = congruent(1, min(w, n), shift(w), stride) + windows + tail
    return Pass("windows", window, tuple(contexts), stride, keep_after=0 if keep else None,
                targets=targets[max(contexts)], forward_tokens=forward,
                targets_by_context=tuple(targets[w] for w in contexts))


def stateful_pass(model, n: int, chunk: int, streams: int, keep_after: int | None, stride: int = 1) -> Pass:
    """scores.score_stateful: `streams` streams side by side in chunks, the state carried; every
    stride-th stream, whole (stream 0, stride, 2 stride, ...)."""
    streams = max(1, min(streams, n))
    length = -(-n // streams)
    rows = range(0, streams, stride)
    forward = len(rows) * sum(model.forward_cost(start, min(chunk, length - start))
                              for start in range(0, length, chunk))
    targets = sum(max(0, min(length, n - s * length)) for s in rows)
    return Pass("stateful", chunk, stride=stride, streams=streams, keep_after=keep_after, targets=targets,
                forward_tokens=forward)


def one_pass(model, n: int, keep: bool) -> Pass:
    """scores.score_in_one_pass: one stream, in chunks, the state carried: every target from all before it."""
    forward = sum(model.forward_cost(start, min(ONE_PASS_CHUNK, n - start)) for start in range(0, n, ONE_PASS_CHUNK))
    return Pass("one_pass", keep_after=0 if keep else None, targets=n, forward_tokens=forward)


# --- the curve's points ---------------------------------------------------------------------------
def context_lengths(max_window: int) -> list[int]:
    """1, 2, 4, ... below max_window, then max_window itself (the training window)."""
    lengths, w = [], 1
    while w < max_window:
        lengths.append(w)
        w *= 2
    return lengths + [max_window]


def curve_lengths(context: int | None, seq_len: int, longest: int | None, n: int) -> tuple[list[int], list[int]]:
    """The curve's points up to the training window (`context_lengths`) and past it: 2, 4, 8 ... times
    seq_len up to `longest`, each where the split has a target with that much context before it. A
    finite-context model's curve stops at the first point that holds its whole context."""
    lengths, beyond, w = context_lengths(seq_len), [], 2 * seq_len
    while longest and w <= longest and w < n:
        beyond.append(w)
        w *= 2
    stop = next((w for w in lengths + beyond if context is not None and w >= context), None)
    if stop is None:
        return lengths, beyond
    return [w for w in lengths if w <= stop], [w for w in beyond if w <= stop]


# --- the plan -------------------------------------------------------------------------------------
@dataclass
class _Unit:
    """Passes that share one stride: `make(stride)` builds them, `figures(passes, first_index)` names
    what they give. A fixed unit is always exact (the floor)."""
    make: object
    figures: object
    fixed: bool
    most: int | None = None  # the largest stride (None: half the targets, two of them at the least)
    optional: bool = False  # left out (no passes) when even its largest stride does not fit its share
    passes: list[Pass] = field(default_factory=list)

    def cost(self, stride: int) -> int:
        return sum(p.forward_tokens for p in self.make(stride))


def _smallest_stride(unit: _Unit, share: float, n: int) -> int:
    """The smallest stride whose passes fit in `share` forward tokens; at most the unit's `most`, by
    default n // 2, so that a pass scores two targets at the least (a standard error needs two)."""
    most = unit.most or max(1, n // 2)
    stride = max(1, min(most, math.ceil(unit.cost(1) / max(share, 1))))
    while stride < most and unit.cost(stride) > share:
        stride += 1
    while stride > 1 and unit.cost(stride - 1) <= share:  # a cost that falls faster than 1/stride (the text's)
        stride -= 1
    return stride


def allocate(units: list[_Unit], budget: int | None, n: int) -> None:
    """Each unit's passes at the stride the budget gives it (the module docstring's rule)."""
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


def _figure(name: str, context, cost: int, passes, at: int, index: int, forward: int | None = None) -> Figure:
    """A figure from passes[0] (scored at its context `at`) and any others (its forward tokens too)."""
    first = passes[0]
    targets = first.targets
    if first.contexts:  # a windows pass: the targets of the context asked for (else of its longest)
        targets = dict(zip(first.contexts, first.targets_by_context)).get(at, first.targets)
    ids = tuple(range(index, index + len(passes)))
    return Figure(name, context, cost, targets, sum(p.forward_tokens for p in passes) if forward is None
                  else forward, ids)


def plan_evaluation(model, n: int, *, seq_len: int, window: int, streams: int, budget: int | None,
                    windowed: bool = True, bigram: bool = True, curve: bool = True,
                    curve_longest: int | None = None, text: TextDemand | None = None) -> Plan:
    """The plan of an evaluation on a split of `n` targets: stateful and stateless always; the windowed
    figure at `window` and the bigram when asked; with `curve`, the context curve up to seq_len and on
    to curve_longest, and stateful - windowed paired (the end-of-run evaluation); the text statistics'
    samples when `text` asks for them (after the modes' figures, before the curve's own passes)."""
    shape = _Shape(model, n, seq_len, window, streams, windowed, curve,
                   *(curve_lengths(model.context, seq_len, curve_longest, n) if curve else ([], [])))
    units = shape.units(bigram)
    if text:
        at = next((i + 1 for i, u in enumerate(units) if u.make == shape.windowed_passes), len(units))
        units.insert(at, _Unit(text.make, lambda ps, i: [_figure(TEXT, None, 0, ps, None, i)] if ps else [],
                               False, max(1, text.samples // 2), optional=True))
    allocate(units, budget, n)
    passes, figures = [], []
    for u in units:
        figures += u.figures(u.passes, len(passes))
        passes += u.passes
    if shape.keep is not None:
        figures.append(_state_gain(passes, figures, n))
    figures.sort(key=_order)
    return Plan(tuple(passes), tuple(figures), n, budget, window, seq_len, max(1, min(streams, n)))


@dataclass
class _Shape:
    """What an evaluation asks of a model: the passes each figure needs, as units for `allocate`."""
    model: object
    n: int
    seq_len: int
    window: int
    streams: int
    windowed: bool
    curve: bool
    lengths: list[int]  # the curve's points up to seq_len
    beyond: list[int]  # and past it

    def __post_init__(self):
        context = self.context = self.model.context
        self.cost = self.model.tokens_per_prediction
        self.whole_window = context is not None and context <= self.window  # a window holds all it sees
        self.whole = [w for w in self.lengths + self.beyond if context is not None and w >= context]  # one at most
        self.short = [w for w in self.lengths if w not in self.whole]
        self.long = [w for w in self.beyond if w not in self.whole]
        # The windowed figure's windows give the short points too; its targets pair with stateful's.
        self.shares = self.windowed and not self.whole_window and self.window == self.seq_len
        self.keep = self.window if self.curve and self.windowed else None

    def whole_context(self, stride: int) -> list[Pass]:  # every target from all the model can see
        if stride == 1:
            return [one_pass(self.model, self.n, keep=self.curve)]
        return [windows_pass(self.model, self.n, self.context, [self.context], stride, keep=self.curve)]

    def stateful(self, stride: int) -> list[Pass]:
        """A sample of what the model sees statefully: a finite-context model's every stride-th target
        from its own last `context` tokens; a recurrent model's every stride-th stream, whole."""
        if stride == 1 or self.context is None:
            return [stateful_pass(self.model, self.n, self.seq_len, self.streams, self.keep, stride)]
        return [windows_pass(self.model, self.n, self.context, [self.context], stride, keep=self.keep is not None)]

    def windowed_passes(self, stride: int) -> list[Pass]:
        if self.whole_window:
            return self.whole_context(stride)
        contexts = sorted({self.window, *self.short}) if self.shares else [self.window]
        return [windows_pass(self.model, self.n, self.window, contexts, stride, keep=self.curve)]

    def windowed_figures(self, passes, i) -> list[Figure]:
        at = self.context if self.whole_window else self.window
        figures = [_figure(WINDOWED, at, min(self.window, self.cost) if self.whole_window else self.window,
                           passes, at, i)]
        shared = (self.short if self.shares else []) + (self.whole if self.whole_window else [])
        return figures + [_figure(f"curve {w}", w, min(w, self.cost) if w in self.whole else w, passes, w, i, 0)
                          for w in shared]

    def long_passes(self, stride: int) -> list[Pass]:  # a reference pass at seq_len, then one per point
        return [windows_pass(self.model, self.n, w, [w], stride, keep=True) for w in (self.seq_len, *self.long)]

    def long_figures(self, passes, i) -> list[Figure]:  # the reference pass counted once, with the first point
        return [Figure(f"curve {w}", w, w, p.targets, p.forward_tokens + (passes[0].forward_tokens if j == 0 else 0),
                       (i, i + j + 1)) for j, (w, p) in enumerate(zip(self.long, passes[1:]))]

    def short_figures(self, passes, i) -> list[Figure]:  # the pass counted once, with the longest point
        return [_figure(f"curve {w}", w, w, passes, w, i, None if w == max(self.short) else 0) for w in self.short]

    def units(self, bigram: bool) -> list[_Unit]:
        """In the study's order (the budget's priority): stateful, stateless, bigram, windowed, the curve."""
        model, n, cost = self.model, self.n, self.cost
        streams = max(1, min(self.streams, n)) if self.context is None else None  # a recurrent model's sample
        units = [_Unit(self.stateful, lambda ps, i: [_figure(STATEFUL, None, cost, ps, self.context, i)], False,
                       streams),
                 _Unit(lambda s: [Pass("vocabulary", targets=n, forward_tokens=model.vocab_size)],
                       lambda ps, i: [_figure(STATELESS, 1, 0, ps, None, i)], True)]
        if bigram:
            units.append(_Unit(lambda s: [Pass("count", targets=n)], lambda ps, i: [_figure(BIGRAM, 1, 0, ps, None, i)],
                               True))
        if self.windowed:
            units.append(_Unit(self.windowed_passes, self.windowed_figures, self.whole_window and cost == 1))
        if self.short and not self.shares:
            units.append(_Unit(lambda s: [windows_pass(model, n, max(self.short), self.short, s, keep=self.curve)],
                               self.short_figures, False))
        if self.whole and not (self.windowed and self.whole_window):
            units.append(_Unit(self.whole_context, lambda ps, i: [_figure(f"curve {w}", w, cost, ps, None, i)
                                                                  for w in self.whole], cost == 1))
        if self.long:
            units.append(_Unit(self.long_passes, self.long_figures, False))
        return units


def _order(f: Figure) -> tuple:
    """Modes first (stateful, stateless, windowed, bigram), then the curve by context, then the gain."""
    names = (STATEFUL, STATELESS, WINDOWED, BIGRAM, TEXT)
    if f.name in names:
        return (0, names.index(f.name))
    return (1, f.context) if f.name.startswith("curve ") else (2, 0)


def _state_gain(passes: list[Pass], figures: list[Figure], n: int) -> Figure:
    """stateful - windowed on the targets both scored: the warm targets of the stateful pass (those
    with at least keep_after tokens of their stream before them) that the windowed figure scored."""
    stateful, windowed = (next(f for f in figures if f.name == name) for name in (STATEFUL, WINDOWED))
    a, b = passes[stateful.passes[0]], passes[windowed.passes[0]]
    # Strided windows score the targets u = 1 (mod stride) (windows at their own window: shift 1).
    stride = math.lcm(a.stride if a.kind == "windows" else 1, b.stride if b.kind == "windows" else 1)
    if a.kind == "stateful":  # every a.stride-th stream
        length = -(-n // a.streams)
        targets = sum(congruent(s * length + a.keep_after + 1, min((s + 1) * length, n), 1, stride)
                      for s in range(0, a.streams, a.stride))
    else:
        targets = congruent(1, n, 1, stride)
    return Figure(STATE_GAIN, None, 0, targets, 0, stateful.passes + windowed.passes)
