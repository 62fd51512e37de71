"""Scoring a model on a split in every inference mode: NLL per token and bits per character. The target-position
arithmetic below is the plan's too; two loops serve every pass, `carried_chunks` (the state carried) and
`window_batches` (each window from the initial state): docs/evaluation.md, *The plan and the budget*.
"""

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

from gru_experiments.data.batches import IGNORE_INDEX, EvalBatches
from gru_experiments.data.token_ids import release_pages
from gru_experiments.data.tokenizers import plain_tokens
from gru_experiments.models.cuda_graphs import graphed
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.protocol import WINDOW_BATCH_TOKENS
from gru_experiments.study.generation import eval_mode, plain_logits

ONE_PASS_CHUNK = 1 << 12  # score_windowed's one pass (a model that sees at most the window): chunks of this many tokens


# --- Which targets a pass scores: the one home of the target-position arithmetic ----------------
def congruent(low: int, high: int, residue: int, stride: int) -> range:
    """The integers u in [low, high] with u = residue (mod stride), ascending (len() counts them)."""
    return range(low + (residue - low) % stride, high + 1, stride)


def window_targets(n: int, window: int, w: int, stride: int) -> tuple[range, range, range]:
    """The targets context w of a windows pass scores, by where each comes from: (head) the prefix
    ids[:window], u <= w; (starts) the windows ids[s : s + window], by start s, target s + w; (tail) the last
    ones, from their own w tokens. All u = w + 1 - window (mod stride): the full window's sample, shifted."""
    shift = w + 1 - window
    head = congruent(1, min(w, n), shift, stride)
    starts = congruent(1, n - window, 1 - window, stride)
    tail = congruent(min(max(n - window + w, w), n) + 1, n, shift, stride)
    return head, starts, tail


def stream_layout(n: int, streams: int) -> tuple[int, int]:
    """(streams, length): n targets as contiguous streams of `length` side by side (the last one short)."""
    streams = max(1, min(streams, n))
    return streams, -(-n // streams)


def stream_rows(ids: Tensor, streams: int, stride: int = 1) -> tuple[Tensor, Tensor, Tensor, int]:
    """ids (N,) as the stateful pass lays them out: (inputs, targets, rows, length), the n = N - 1 targets as
    `streams` contiguous streams of `length` (stream_layout), every stride-th of them: row r's inputs are
    ids[s * length : (s + 1) * length] for s = rows[r], its targets the next ids, IGNORE_INDEX past the split's
    end. Built row by row from `ids` (any integer width; a memory map stays unread but for the rows taken): no
    copy of the whole split, which a sampled pass (stride > 1) at a gigabyte would not fit."""
    n = max(ids.numel() - 1, 0)
    streams, length = stream_layout(n, streams)
    rows = torch.arange(0, streams, stride, device=ids.device)
    inputs = torch.zeros(rows.numel(), length, dtype=torch.long, device=ids.device)
    targets = torch.full((rows.numel(), length), IGNORE_INDEX, dtype=torch.long, device=ids.device)
    for r, s in enumerate(rows.tolist()):
        start = s * length
        t = max(min(length, n - start), 0)  # the last streams may be short, or empty
        inputs[r, :t], targets[r, :t] = ids[start:start + t], ids[start + 1:start + t + 1]
    return inputs, targets, rows, length


def warm_targets(n: int, streams: int, stride: int, after: int, every: int = 1) -> int:
    """How many targets of every stride-th stream have at least `after` tokens of their stream before
    them (those a stateful pass keeps for a paired difference), counting only u = 1 (mod every)."""
    streams, length = stream_layout(n, streams)
    return sum(len(congruent(s * length + after + 1, min((s + 1) * length, n), 1, every))
               for s in range(0, streams, stride))


def token_counts(ids: Tensor, vocab_size: int, chunk: int = 1 << 24) -> Tensor:
    """How often each token id occurs in `ids` ((vocab_size,) int64), counted a chunk at a time: a gigabyte's
    split never gathered whole."""
    counts = torch.zeros(vocab_size, dtype=torch.long, device=ids.device)
    for start in range(0, ids.numel(), chunk):
        counts += torch.bincount(ids[start:start + chunk].long(), minlength=vocab_size)[:vocab_size]
    return counts


@dataclass(frozen=True)
class Split:
    """A split's token ids, the characters each token id decodes to ((V,): what bits per character needs)
    and `plain`, the tokens its predictions are normalised over (generation.plain_logits; None: all)."""
    ids: Tensor
    char_lengths: Tensor
    plain: Tensor | None = None

    @classmethod
    def of(cls, ids: Tensor, tokenizer) -> "Split":
        """Plain text over the corpus's own symbols; text holding the probe's (a planting) over all."""
        plain = plain_tokens(tokenizer)
        if plain is not None and not bool(plain.to(ids.device)[token_counts(ids, plain.numel()) > 0].all()):
            plain = None
        return cls(ids, tokenizer.token_char_lengths, plain)

    def to(self, device) -> "Split":
        return Split(self.ids.to(device), self.char_lengths.to(device),
                     None if self.plain is None else self.plain.to(device))

    @property
    def n_targets(self) -> int:
        """Every token but the first is a target."""
        return max(self.ids.numel() - 1, 0)

    @cached_property  # (a frozen dataclass keeps it: it is set in the instance's __dict__)
    def characters(self) -> int:
        counts = token_counts(self.ids, self.char_lengths.numel())
        return int((counts * self.char_lengths.to(counts.device)).sum())


@dataclass
class Score:
    nll_sum: float = 0.0  # nats, summed over scored tokens
    tokens: int = 0
    characters: int = 0
    # Second moments of the per-target (nll, characters) pairs, for the standard error of a sample.
    moments: tuple[float, float, float] = field(default=(0.0, 0.0, 0.0))  # sums of nll^2, nll*chars, chars^2

    # The scored targets' positions in the split and NLLs (nats), when kept (targets=True): paired_difference's.
    positions: Tensor | None = None
    target_nll: Tensor | None = None
    population: int = 0  # the targets these were drawn from (the split's); tokens == population: exact
    readings: dict | None = None  # a StatefulPass's readers' (plan.Entry.read), by name: what each read of every chunk

    def add(self, other: "Score") -> "Score":
        return Score(self.nll_sum + other.nll_sum, self.tokens + other.tokens, self.characters + other.characters,
                     tuple(a + b for a, b in zip(self.moments, other.moments)))

    def of(self, population: int) -> "Score":
        return replace(self, population=population)

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
    def exact(self) -> bool:
        return self.tokens == self.population

    @property
    def sampling_se(self) -> float:
        """The standard error of the figure as an estimate of the population's: 0 when exact, else `bpc_se`."""
        return 0.0 if self.exact else self.bpc_se

    @property
    def bpc_se(self) -> float:
        """Standard error of `bpc` as a ratio estimator over independent targets; a whole-split figure has
        it too: it is what separates two models' figures (*GRUs remain competitive with transformers*)."""
        n = self.tokens
        if n < 2 or not self.characters:
            return float("nan")
        ratio = self.nll_sum / self.characters
        nll_sq, nll_chars, chars_sq = self.moments
        residual = max(nll_sq - 2 * ratio * nll_chars + ratio * ratio * chars_sq, 0.0)
        return math.sqrt(residual / (n * (n - 1))) / (self.characters / n) / math.log(2)


def score_batch(logits: Tensor, targets: Tensor, char_lengths: Tensor, plain: Tensor | None = None) -> Score:
    """The Score of logits (..., V) against targets (...), IGNORE_INDEX positions skipped."""
    targets = targets.reshape(-1)
    nll = target_nll(logits, targets, plain)
    scored = targets != IGNORE_INDEX
    return _score_nll(nll[scored], targets[scored], char_lengths)


def target_nll(logits: Tensor, targets: Tensor, plain: Tensor | None = None) -> Tensor:
    """The NLL (nats) of every target (0 at IGNORE_INDEX), normalised over `plain` (None: all V)."""
    logits = plain_logits(logits.reshape(-1, logits.shape[-1]).float(), plain)
    return F.cross_entropy(logits, targets.reshape(-1).long(), ignore_index=IGNORE_INDEX, reduction="none")


def _score_nll(nll: Tensor, targets: Tensor, char_lengths: Tensor) -> Score:
    nll, chars = nll.double(), char_lengths.to(targets.device)[targets].double()
    moments = torch.stack([(nll * nll).sum(), (nll * chars).sum(), (chars * chars).sum()]).tolist()
    return Score(nll.sum().item(), targets.numel(), int(chars.sum().item()), tuple(moments))


@torch.no_grad()
def score_chunks(model, split: Split, seq_len: int, batch_size: int) -> Score:
    """The validation pass (val_loss, val_bpc): chunks of seq_len tokens, each from a zero state."""
    total = Score()
    with eval_mode(model):
        for inputs, targets in EvalBatches(split.ids, batch_size, seq_len):
            logits, _ = model(inputs)
            total = total.add(score_batch(logits, targets, split.char_lengths, split.plain))
    return total


# --- The two loops every mode runs ----------------------------------------------------------

@torch.no_grad()  # on a generator, torch turns gradients off around each step only, not while suspended
def carried_chunks(model, inputs: Tensor, seq_len: int, end: int | None = None, tick=None, features: bool = False):
    """The stateful loop: inputs (B, T) in chunks of seq_len from the initial state, the state carried, the chunks
    that start before `end` (default T); yields (start, logits (B, t, V), the final hidden states (B, t, C) with
    `features` (the protocol's forward_features: None for a model without), else None). Forward tokens:
    B * chunks_cost."""
    state = None
    with eval_mode(model):
        forward = graphed(model)  # on CUDA, each chunk's shape replayed from a graph (models/cuda_graphs.py)
        for start in range(0, inputs.shape[1] if end is None else end, seq_len):
            tokens = inputs[:, start:start + seq_len]
            if features:
                logits, state, hidden = forward.forward_features(tokens, state)
            else:
                (logits, state), hidden = forward(tokens, state), None
            if tick is not None:  # a progress bar's (generation.Progress)
                tick(logits.shape[0] * logits.shape[1])
            yield start, logits, hidden


def chunks_cost(model, length: int, seq_len: int, end: int | None = None) -> int:
    """The forward tokens carried_chunks runs for one row of `length` tokens."""
    return sum(model.forward_cost(start, min(seq_len, length - start))
               for start in range(0, length if end is None else end, seq_len))


@torch.no_grad()
def window_batches(model, ids: Tensor, ends: Tensor, length: int, rows: Tensor | None = None, tick=None):
    """The windowed loop: the windows ids[end - length : end] (ids (N,), or (B, N) with their `rows`), each
    from the initial state, WINDOW_BATCH_TOKENS at a time; yields (indices into ends, logits)."""
    offsets, batches = torch.arange(-length, 0, device=ids.device), torch.arange(ends.numel(), device=ends.device)
    with eval_mode(model):
        forward = graphed(model)
        for batch in batches.split(max(1, WINDOW_BATCH_TOKENS // length)) if ends.numel() else ():
            at = ends[batch].unsqueeze(1) + offsets
            logits, _ = forward(ids[at] if rows is None else ids[rows[batch].unsqueeze(1), at])
            if tick is not None:
                tick(batch.numel() * length)
            yield batch, logits


# --- The inference modes on a whole split: the same targets ids[1:] (or every stride-th), comparable ---

@dataclass(frozen=True)
class StatefulChunk:
    """One chunk of a stateful pass as a reader sees it (score_stateful's `read`): the columns start .. start + t
    of the pass's `rows` (every stride-th of the split's streams of `length` tokens; row r, column j is the input
    at rows[r] * length + j, whose target follows it). logits (R, t, V); targets (R, t), IGNORE_INDEX past the
    split's end; nll (R, t) every target's NLL (nats, float32; 0 at IGNORE_INDEX); features (R, t, C) the final
    hidden states that predicted them (the protocol's forward_features), None for a model without (an n-gram)."""
    rows: Tensor
    length: int
    start: int
    logits: Tensor
    targets: Tensor
    nll: Tensor
    features: Tensor | None


def score_stateful(model, split: Split, seq_len: int, streams: int, targets_after: int | None = None,
                   tick=None, stride: int = 1, read=None) -> Score:
    """Stateful: `streams` contiguous streams side by side in chunks of seq_len, the state carried.
    targets_after=k keeps the NLL of every target with at least k tokens of its stream before it
    (Score.positions); stride > 1 runs every stride-th stream only, whole: a sample. read: called with every
    chunk (a StatefulChunk, its final hidden states included) in the same forward, the figures unchanged."""
    ids, keep = split.ids, targets_after is not None
    n_targets = split.n_targets
    inputs, targets, rows, length = stream_rows(ids, streams, stride)

    total, nll = Score(), []
    for start, logits, features in carried_chunks(model, inputs, seq_len, tick=tick, features=read is not None):
        chunk = targets[:, start:start + seq_len]
        total = total.add(score_batch(logits, chunk, split.char_lengths, split.plain))
        if keep or read is not None:
            nll.append(target_nll(logits, chunk, split.plain).view(rows.numel(), -1))
        if read is not None:
            read(StatefulChunk(rows, length, start, logits, chunk, nll[-1], features))
    total = total.of(n_targets)
    if keep and nll:  # row s, column j: the input at s * length + j, whose target is the next position
        positions = rows.unsqueeze(1) * length + torch.arange(length, device=ids.device) + 1
        warm = (torch.arange(length, device=ids.device) >= targets_after) & (positions <= n_targets)
        return total.with_targets([positions[warm]], [torch.cat(nll, dim=1)[warm]])
    return total


@torch.no_grad()
def stateless_log_probs(model, plain: Tensor | None = None) -> Tensor:
    """(V, V) table of log p(next token | a) from a zero state, normalised over `plain`: one forward pass."""
    with eval_mode(model):
        vocab = torch.arange(model.vocab_size, device=model.device).unsqueeze(1)
        logits, _ = model(vocab)
    # A small table: float64 keeps count models exact.
    return F.log_softmax(plain_logits(logits[:, 0].double(), plain), dim=-1)


TABLE_CHUNK = 1 << 24  # targets a table scores at once (every split up to 16M tokens in one: its sums as before)


def score_table(log_probs: Tensor, split: Split, targets: bool = False) -> Score:
    """Every target of the split scored by a first-order table: log_probs[previous, target]. targets=True keeps
    every target's NLL."""
    log_probs, score, kept = log_probs.to(split.ids.device), Score(), []
    for start in range(1, split.ids.numel(), TABLE_CHUNK):  # in chunks: a long split's NLLs never all at once
        chunk = split.ids[start - 1:start + TABLE_CHUNK].long()
        previous, ids = chunk[:-1], chunk[1:]
        nll = -log_probs[previous, ids]
        score = score.add(_score_nll(nll, ids, split.char_lengths))
        kept.append(nll if targets else None)
    score = score.of(split.n_targets)
    positions = torch.arange(1, split.ids.numel(), device=split.ids.device)
    return score.with_targets([positions], kept or [positions.double()]) if targets else score  # (empty)


def score_stateless(model, split: Split) -> Score:
    """Stateless: every target from its previous token alone, from a zero state (exact)."""
    return score_table(stateless_log_probs(model, split.plain), split)


def score_bigram(train_ids: Tensor, split: Split) -> Score:
    """The baseline: an add-one smoothed bigram counted from the training split."""
    device = split.ids.device
    bigram = NGramLM(split.char_lengths.numel(), order=2, smoothing="add_one").to(device).fit_in_chunks(
        train_ids, release=release_pages)  # a mapped split's pages given back as counted
    return score_stateless(bigram, split)


def score_windowed(model, split: Split, window: int, targets: bool = False) -> Score:
    """Windowed, exact: every target from the `window` tokens before it, from a zero state (a model that
    sees at most `window` tokens: one stream, the state carried). targets=True keeps every target's NLL."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if model.context is not None and model.context <= window:
        return score_stateful(model, split, ONE_PASS_CHUNK, 1, targets_after=0 if targets else None)
    return score_contexts(model, split, window, [window], targets=targets)[window]


def paired_difference(a: Score, b: Score, split: Split) -> Score:
    """a minus b on the targets both kept, paired target by target: its `.bpc_se` is far smaller than
    either figure's own. Exact when both are; else a sample of a's population."""
    device = split.ids.device
    (pa, ia), (pb, ib) = (torch.sort(s.positions.to(device)) for s in (a, b))  # the targets in order, found in b
    na, nb = a.target_nll.to(device, torch.float64)[ia], b.target_nll.to(device, torch.float64)[ib]
    if not pb.numel():  # nothing to pair with
        pb, nb = pb.new_zeros(1), nb.new_full((1,), math.nan)
    at = torch.searchsorted(pb, pa).clamp(max=pb.numel() - 1)
    paired = (pb[at] == pa) & ~torch.isnan(na) & ~torch.isnan(nb[at])
    both = pa[paired]
    difference = _score_nll(na[paired] - nb[at[paired]], split.ids[both], split.char_lengths)
    return difference.of(difference.tokens if a.exact and b.exact else a.population)


@torch.no_grad()
def score_contexts(model, split: Split, window: int, contexts, stride: int = 1, *, targets: bool = False,
                   tick=None) -> dict[int, Score]:
    """{w: the windowed figure with context w} for every w in `contexts`, all from the windows of `window`
    tokens: a window ids[s : s + window] predicts, at position w - 1, the target s + w from exactly its
    w tokens. Which targets: window_targets. targets=True keeps every target's NLL."""
    if stride < 1 or any(not 1 <= w <= window for w in contexts):
        raise ValueError(f"contexts must lie in 1..{window} and stride be >= 1, got {list(contexts)} and {stride}")
    ids, n, device = split.ids, split.n_targets, split.ids.device
    totals = {w: Score() for w in contexts}
    kept = {w: ([], []) for w in contexts}  # targets=True: positions and NLLs

    def add(w: int, logits: Tensor, positions: Tensor) -> None:
        totals[w] = totals[w].add(score_batch(logits, ids[positions], split.char_lengths, split.plain))
        if targets:
            kept[w][0].append(positions)
            kept[w][1].append(target_nll(logits, ids[positions], split.plain))

    with eval_mode(model):
        # Targets 1..window: their contexts are prefixes of ids[:window] (one pass predicts all).
        logits, _ = model(ids[:window].unsqueeze(0))
        for w in contexts:
            head = _positions(window_targets(n, window, w, stride)[0], device)
            if head.numel():
                add(w, logits[0, head - 1], head)
        # The windows ids[s : s + window] of the full window's targets t = s + window in (window, n].
        ends = _positions(window_targets(n, window, window, stride)[1], device) + window
        for batch, logits in window_batches(model, ids, ends, window, tick=tick):
            for w in contexts:
                add(w, logits[:, w - 1], ends[batch] - window + w)
        # The last targets of a shorter context: n - window + w < u <= n, from their own w tokens.
        for w in contexts:
            tail = _positions(window_targets(n, window, w, stride)[2], device)
            if tail.numel():
                logits, _ = model(ids[tail.unsqueeze(1) + torch.arange(-w, 0, device=device)])
                add(w, logits[:, -1], tail)
    totals = {w: totals[w].of(n) for w in contexts}
    if targets:
        return {w: totals[w].with_targets(*kept[w]) if kept[w][0] else totals[w] for w in contexts}
    return totals


def _positions(targets: range, device) -> Tensor:
    return torch.arange(targets.start, max(targets.start, targets.stop), targets.step, device=device)


def score_at(result: dict, context) -> Score:
    """A pass's Score at `context`: its one figure (None), or a finite-context model's longest."""
    if context in result:
        return result[context]
    return result[None] if None in result else result[max(result)]


def score_subset(score: Score, keep: Tensor, split: Split, population: int | None = None) -> Score:
    """The part of a Score that kept its targets on those `keep` (a bool mask over the split) marks; `population`:
    the targets it marks, when the caller counted them (a sum over the split)."""
    chosen = keep.to(score.positions.device)[score.positions]
    positions, nll = score.positions[chosen], score.target_nll[chosen]
    subset = _score_nll(nll, split.ids[positions], split.char_lengths)
    population = int(keep[1:].count_nonzero()) if population is None else population
    return replace(subset, positions=positions, target_nll=nll, population=population)
