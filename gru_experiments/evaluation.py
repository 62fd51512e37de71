"""Scoring a model on a whole split: NLL per token and bits per character.

Bits per character makes char and subword models comparable: the split's total
NLL (in bits) divided by the number of characters its scored tokens decode to.

The figures (docs/evaluation.md):

    score_chunks     the training-time validation pass: the split cut into chunks of seq_len, each
                     chunk from a zero state (val_loss, val_bpc)
    score_stateful   the inference mode "stateful": the state carried through the whole split
    score_stateless  the mode "stateless": every target from its previous token alone
    score_windowed   the mode "windowed": every target from its own window of the `window` tokens
                     before it, from a zero state
    score_bigram     the count-based bigram baseline of the training split
    context_curve    bits per character against the context given: score_windowed at
                     w = 1, 2, 4, ... up to the training window, on past it (256, 512, 1024 by
                     default), and stateful (unbounded)
    paired_difference  one figure minus another, target by target, with its standard error: e.g.
                     stateful - windowed, what carrying the state buys beyond the window
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from gru_experiments.data import IGNORE_INDEX, EvalBatches
from gru_experiments.inference import MODES, eval_mode
from gru_experiments.ngram import NGramLM
from gru_experiments.progress import NO_PROGRESS

FIGURES = (*MODES, "bigram")  # what the evaluation reports: every inference mode and the bigram baseline


@dataclass(frozen=True)
class Split:
    """A split's token ids with the number of characters each token id decodes to (the
    tokenizer's token_char_lengths, a (V,) tensor): everything bits per character needs."""
    ids: Tensor
    char_lengths: Tensor

    @classmethod
    def of(cls, ids: Tensor, tokenizer) -> "Split":
        return cls(ids, tokenizer.token_char_lengths)

    def to(self, device) -> "Split":
        return Split(self.ids.to(device), self.char_lengths.to(device))

    @property
    def n_targets(self) -> int:
        """Every token but the first is a target."""
        return max(self.ids.numel() - 1, 0)

    @property
    def characters(self) -> int:
        """Characters of the whole split (all its tokens)."""
        return int(self.char_lengths.to(self.ids.device)[self.ids].sum().item())


@dataclass
class Score:
    nll_sum: float = 0.0  # nats, summed over scored tokens
    tokens: int = 0
    characters: int = 0
    # Second moments of the per-target (nll, characters) pairs, for the standard error of a sample.
    moments: tuple[float, float, float] = field(default=(0.0, 0.0, 0.0))  # sums of nll^2, nll*chars, chars^2

    # Which targets were scored and their NLLs, when the scoring function was asked to keep them
    # (targets=True): (positions in the split, nll in nats), for paired comparisons (paired_difference).
    positions: Tensor | None = None
    target_nll: Tensor | None = None

    def add(self, other: "Score") -> "Score":
        return Score(self.nll_sum + other.nll_sum, self.tokens + other.tokens, self.characters + other.characters,
                     tuple(a + b for a, b in zip(self.moments, other.moments)))

    def with_targets(self, positions: list[Tensor], nll: list[Tensor]) -> "Score":
        return replace(self, positions=torch.cat(positions), target_nll=torch.cat(nll).double())

    @property
    def nll(self) -> float:
        """Mean NLL per token, in nats."""
        return self.nll_sum / max(self.tokens, 1)

    @property
    def bpc(self) -> float:
        return self.nll_sum / math.log(2) / max(self.characters, 1)

    @property
    def bpc_se(self) -> float:
        """Standard error of `bpc` as an estimate from these targets (a ratio estimator, the targets
        taken as independent draws: for a systematic sample of a text an approximation). 0 when
        every target of the split was scored, the figure then being exact, is for the caller to say."""
        n = self.tokens
        if n < 2 or not self.characters:
            return float("nan")
        ratio = self.nll_sum / self.characters
        nll_sq, nll_chars, chars_sq = self.moments
        residual = max(nll_sq - 2 * ratio * nll_chars + ratio * ratio * chars_sq, 0.0)
        return math.sqrt(residual / (n * (n - 1))) / (self.characters / n) / math.log(2)


def score_batch(logits: Tensor, targets: Tensor, char_lengths: Tensor) -> Score:
    """Summed NLL of logits (..., V) against targets (...), IGNORE_INDEX positions skipped;
    char_lengths: characters per token id."""
    targets = targets.reshape(-1)
    nll = target_nll(logits, targets)
    scored = targets != IGNORE_INDEX
    return _score_nll(nll[scored], targets[scored], char_lengths)


def target_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """The NLL (nats) of every target: logits (..., V), targets (...) -> (N,) float32, 0 at IGNORE_INDEX."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="none")


def _score_nll(nll: Tensor, targets: Tensor, char_lengths: Tensor) -> Score:
    """A Score from per-target NLLs (nats) and their target ids."""
    nll, chars = nll.double(), char_lengths.to(targets.device)[targets].double()
    moments = torch.stack([(nll * nll).sum(), (nll * chars).sum(), (chars * chars).sum()]).tolist()
    return Score(nll.sum().item(), targets.numel(), int(chars.sum().item()), tuple(moments))


@torch.no_grad()
def score_chunks(model, split: Split, seq_len: int, batch_size: int) -> Score:
    """The validation pass (val_loss, val_bpc): the split cut into chunks of seq_len tokens, every
    target predicted from the previous tokens of its chunk, each chunk from a zero state."""
    total = Score()
    with eval_mode(model):
        for inputs, targets in EvalBatches(split.ids, batch_size, seq_len):
            logits, _ = model(inputs)
            total = total.add(score_batch(logits, targets, split.char_lengths))
    return total


# --- The inference modes on a whole split ---------------------------------------------------
# Every function below scores the same targets, ids[1:], each exactly once (or a documented
# sample of them), so their numbers compare directly, and with `score_chunks`.

@torch.no_grad()
def score_stateful(model, split: Split, seq_len: int, streams: int, targets_after: int | None = None,
                   tick=None) -> Score:
    """Stateful: the split cut into `streams` contiguous streams run side by side, chunk by chunk
    (chunks of seq_len), the state carried across chunk boundaries. Only the first token of each
    stream is predicted from a zero state. targets_after=k keeps the NLL of every target that has
    at least k tokens of its stream before it (Score.positions): the targets whose carried state
    has seen more than a window of k tokens would (k = 0: every target)."""
    ids, keep = split.ids, targets_after is not None
    n_targets = split.n_targets
    streams = max(1, min(streams, n_targets))
    length = -(-n_targets // streams)
    inputs = torch.zeros(streams * length, dtype=torch.long, device=ids.device)
    targets = torch.full((streams * length,), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    inputs[:n_targets], targets[:n_targets] = ids[:-1], ids[1:]  # padding only at the very end
    inputs, targets = inputs.view(streams, length), targets.view(streams, length)

    total, state, nll = Score(), None, []
    with eval_mode(model):
        for start in range(0, length, seq_len):
            logits, state = model(inputs[:, start:start + seq_len], state)
            total = total.add(score_batch(logits, targets[:, start:start + seq_len], split.char_lengths))
            if tick is not None:  # a progress bar's (progress.py)
                tick(logits.shape[0] * logits.shape[1])
            if keep:
                nll.append(target_nll(logits, targets[:, start:start + seq_len]).view(streams, -1))
    if keep:  # row-major over (streams, length): position p + 1 is the target of input p
        warm = (torch.arange(streams * length, device=ids.device) % length >= targets_after)[:n_targets]
        return total.with_targets([torch.arange(1, n_targets + 1, device=ids.device)[warm]],
                                  [torch.cat(nll, dim=1).reshape(-1)[:n_targets][warm]])
    return total


@torch.no_grad()
def stateless_log_probs(model) -> Tensor:
    """(V, V) table: row a holds log p(next token | a) from a zero state, i.e. everything a
    stateless model can ever predict. One forward pass over the whole vocabulary."""
    with eval_mode(model):
        vocab = torch.arange(model.vocab_size, device=model.device).unsqueeze(1)
        logits, _ = model(vocab)
    return F.log_softmax(logits[:, 0].double(), dim=-1)  # a small table: float64 keeps count models exact


def score_table(log_probs: Tensor, split: Split) -> Score:
    """Every target of the split scored by a first-order table: log_probs[previous, target]."""
    previous, targets = split.ids[:-1], split.ids[1:]
    return _score_nll(-log_probs.to(split.ids.device)[previous, targets], targets, split.char_lengths)


def score_stateless(model, split: Split) -> Score:
    """Stateless: every target predicted from its previous token alone, from a zero state
    (exact: the model's whole stateless behaviour is a V x V table)."""
    return score_table(stateless_log_probs(model), split)


def score_bigram(train_ids: Tensor, split: Split) -> Score:
    """The baseline: the n-gram family at order 2, add-one smoothed, counted from the training
    split ((count(a, b) + 1) / (count(a) + V)), every target of the split from its previous token."""
    device = split.ids.device
    bigram = NGramLM(split.char_lengths.numel(), order=2, smoothing="add_one").to(device).fit(train_ids.to(device))
    return score_stateless(bigram, split)


@torch.no_grad()
def score_windowed(model, split: Split, window: int, stride: int = 1, batch_tokens: int = 1 << 16,
                   targets: bool = False, tick=None) -> Score:
    """Windowed: every target predicted from the `window` tokens before it (fewer at the start of
    the split), run from a zero state. Unlike `score_chunks`, each target gets its own window,
    so this costs `window` times a single pass.

    stride > 1 scores only every stride-th target (positions 1, 1 + stride, ...): a systematic
    sample, an estimate rather than the exact figure. Windows go through the model in batches of
    about `batch_tokens` tokens.
    """
    if window < 1 or stride < 1:
        raise ValueError(f"window and stride must be >= 1, got {window} and {stride}")
    if sees_whole_window(model, window):
        # Every window holds all the model can see: one pass over the split, the state carried,
        # predicts each target exactly as its own window would.
        return _score_in_one_pass(model, split, stride, targets=targets, tick=tick)
    return score_contexts(model, split, window, [window], stride, batch_tokens, targets, tick)[window]


def paired_difference(a: Score, b: Score, split: Split) -> Score:
    """a minus b on the targets both scored, paired target by target (both Scores kept their
    targets): `.bpc` is the difference in bits per character, `.bpc_se` its standard error, far
    smaller than either figure's own because the two NLLs of a target move together."""
    n = split.n_targets
    nll = torch.full((2, n + 1), math.nan, dtype=torch.float64, device=split.ids.device)
    nll[0, a.positions] = a.target_nll
    nll[1, b.positions] = b.target_nll
    both = torch.nonzero(~torch.isnan(nll).any(dim=0)).squeeze(1)
    return _score_nll(nll[0, both] - nll[1, both], split.ids[both], split.char_lengths)


@torch.no_grad()
def score_contexts(model, split: Split, window: int, contexts, stride: int = 1,
                   batch_tokens: int = 1 << 16, targets: bool = False, tick=None) -> dict[int, Score]:
    """{w: the windowed figure with context w} for every w in `contexts` (each <= window), all from
    the windows of `score_windowed(window)`: a causal model run from a zero state over a window
    ids[s : s + window] predicts, at position w - 1, the target s + w from exactly the w tokens before
    it. So the windows of every target (one forward pass each) give every shorter context too, at
    no extra forward cost. targets=True keeps every target's NLL (Score.positions).

    Context w scores the targets u = w + 1 - window + stride * i (every stride-th target, the same
    sample as the full window's, shifted): those with u <= w from the prefix pass (all their
    history), the others from the window starting at u - w, and the last window - w of them (whose
    windows would run past the split) from their own window of w tokens.
    """
    if stride < 1 or any(not 1 <= w <= window for w in contexts):
        raise ValueError(f"contexts must lie in 1..{window} and stride be >= 1, got {list(contexts)} and {stride}")
    ids, n = split.ids, split.n_targets
    device = ids.device
    totals = {w: Score() for w in contexts}
    kept = {w: ([], []) for w in contexts}  # targets=True: positions and NLLs

    def add(w: int, logits: Tensor, positions: Tensor) -> None:
        totals[w] = totals[w].add(score_batch(logits, ids[positions], split.char_lengths))
        if targets:
            kept[w][0].append(positions)
            kept[w][1].append(target_nll(logits, ids[positions]))

    with eval_mode(model):
        # Targets 1..window: their contexts are prefixes of ids[:window] (one pass predicts all).
        logits, _ = model(ids[:window].unsqueeze(0))
        for w in contexts:
            head = torch.arange(1, min(w, n) + 1, device=device)
            head = head[(head - (w + 1 - window)) % stride == 0]
            if head.numel():
                add(w, logits[0, head - 1], head)
        # The windows ids[s : s + window] of the full window's targets t = s + window in (window, n].
        starts = torch.arange(1, max(n - window + 1, 1), device=device)
        starts = starts[(starts + window - 1) % stride == 0]
        offsets = torch.arange(window, device=device)
        for chunk in starts.split(max(1, batch_tokens // window)):
            logits, _ = model(ids[chunk.unsqueeze(1) + offsets])
            for w in contexts:
                add(w, logits[:, w - 1], chunk + w)
            if tick is not None:
                tick(chunk.numel() * window)
        # The last targets of a shorter context: n - window + w < u <= n, from their own w tokens.
        for w in contexts:
            tail = torch.arange(min(max(n - window + w, w), n) + 1, n + 1, device=device)
            tail = tail[(tail - (w + 1 - window)) % stride == 0]
            if tail.numel():
                logits, _ = model(ids[tail.unsqueeze(1) + torch.arange(-w, 0, device=device)])
                add(w, logits[:, -1], tail)
    if targets:
        return {w: totals[w].with_targets(*kept[w]) if kept[w][0] else totals[w] for w in contexts}
    return totals


def sees_whole_window(model, window: int) -> bool:
    """A finite-context model (context <= window) sees the same in a window as in the whole history."""
    context = getattr(model, "context", None)
    return context is not None and context <= window


@torch.no_grad()
def _score_in_one_pass(model, split: Split, stride: int, chunk: int = 1 << 12, targets: bool = False,
                       tick=None) -> Score:
    """Targets 1, 1 + stride, ... of the split, each from everything before it (one stream, the
    state carried from chunk to chunk). targets=True keeps every target's NLL (Score.positions)."""
    ids = split.ids
    positions = torch.arange(1, ids.numel(), stride, device=ids.device)
    total, state, nll = Score(), None, []
    inputs = ids[:-1]
    with eval_mode(model):
        for start in range(0, inputs.numel(), chunk):
            logits, state = model(inputs[start:start + chunk].unsqueeze(0), state)
            wanted = positions[(positions > start) & (positions <= start + logits.shape[1])]
            total = total.add(score_batch(logits[0, wanted - 1 - start], ids[wanted], split.char_lengths))
            if targets:
                nll.append(target_nll(logits[0, wanted - 1 - start], ids[wanted]))
            if tick is not None:
                tick(logits.shape[1])
    return total.with_targets([positions], nll) if targets and nll else total


def windowed_stride(stride: int | str, n_targets: int, window: int, training_tokens: int | None = None) -> int:
    """`stride` as an int. "auto" scores every target (exact) unless that would run more tokens
    through the model than training did (training_tokens: steps x batch x seq_len, forward passes
    only); then every k-th target, the smallest such k. So a full recipe is scored exactly, a
    smoke run of a few steps quickly, and the choice never depends on the hardware."""
    if stride != "auto":
        return int(stride)
    if not training_tokens:
        return 1
    return max(1, math.ceil(n_targets * window / training_tokens))


# --- The context curve ----------------------------------------------------------------------
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


def context_curve(model, split: Split, *, max_window: int, stateful: Score, point_tokens: int | None,
                  shared_stride: int = 1, batch_tokens: int = 1 << 16, scores_out: dict | None = None,
                  longest: int | None = None, long_tokens: int | None = None, targets: bool = False,
                  max_targets: int | None = None, progress=NO_PROGRESS) -> dict:
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
    Finite-context models whose context fits in w are scored in one pass, exactly.
    `scores_out`, when given, receives {w: Score}; targets=True keeps the targets of the point
    max_window (the windowed figure) in its Score. `max_targets` (evaluation.max_tokens) caps the
    targets any point scores (`sample_stride`). `progress`: a bar per pass (progress.py).

    Returns {"1": bpc, "2": bpc, ..., "stateful": bpc, "settings": {...}}: the settings record,
    per point, the targets scored, the stride, the tokens run through the model for it and the
    standard error of a sampled point (0 for an exact one)."""
    n = split.n_targets
    lengths = context_lengths(max_window)
    beyond = long_context_lengths(max_window, longest, n)
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
            scores |= score_contexts(model, split, max_window, shared, shared_stride, batch_tokens, targets, tick)
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
            reference = score_contexts(model, split, max_window, [max_window], stride, batch_tokens, True, tick)
        base = scores[max_window]
        base_se = base.bpc_se if base.tokens < n else 0.0
        for w in long:
            with progress.phase(f"context curve {w}", passes * w) as tick:
                scores[w] = score_contexts(model, split, w, [w], stride, batch_tokens, True, tick)[w]
            difference = paired_difference(scores[w], reference[max_window], split)
            strides[w], forward[w] = stride, scores[w].tokens * w
            sampled_se = difference.bpc_se if scores[w].tokens < n else 0.0  # every target: exact
            bpc[w], se[w] = base.bpc + difference.bpc, math.hypot(sampled_se, base_se)
        forward[max(long)] += reference[max_window].tokens * max_window  # the reference pass
    for w in own:
        strides[w] = point_stride(w)
        with progress.phase(f"context curve {w}", len(range(1, n + 1, strides[w])) * w) as tick:
            scores[w] = score_contexts(model, split, w, [w], strides[w], batch_tokens, tick)[w]
        forward[w] = scores[w].tokens * w
    for w in one_pass:
        with progress.phase(f"context curve {w}", n) as tick:
            scores[w], strides[w], forward[w] = _score_in_one_pass(model, split, 1, targets=targets, tick=tick), 1, n
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


# --- Everything at once, from the evaluation config group ------------------------------------
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
    metrics = {}
    for mode, score in scores.items():
        metrics[f"{mode}_nll"] = score.nll
        metrics[f"{mode}_bpc"] = score.bpc
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
    if stateful is None:
        with progress.phase("stateful", n_targets) as tick:
            stateful = score_stateful(model, val, seq_len, streams, tick=tick)
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
        with progress.phase("windowed", used["windowed_targets"] * window) as tick:
            windowed = score_windowed(model, val, window, stride, batch_tokens, targets=curve, tick=tick)
        if curve:
            context = context_curve(model, val, max_window=seq_len, stateful=stateful, point_tokens=point_tokens,
                                    shared_stride=max(curve_stride(n_targets, seq_len, point_tokens),
                                                      sample_stride(n_targets, max_targets)),
                                    batch_tokens=batch_tokens, max_targets=max_targets, progress=progress,
                                    **long_curve)
    scores = {"stateful": stateful, "stateless": score_stateless(model, val), "windowed": windowed,
              "bigram": score_bigram(train_ids, val)}
    used["windowed_bpc_se"] = 0.0 if windowed.tokens == n_targets else windowed.bpc_se
    gain = None
    if curve:  # the final weights: stateful - windowed, paired (stateful again, keeping its targets: one cheap pass)
        # Only the targets whose stream has carried the state past one window: before that the state
        # has seen less than the window has (a cold start of each of the `streams` streams).
        with progress.phase("stateful (paired with windowed)", n_targets) as tick:
            warm = score_stateful(model, val, seq_len, streams, targets_after=window, tick=tick)
        gain = paired_difference(warm, windowed, val)
    return Evaluation(scores, used, context, gain)
