"""The cache figure, p = (1 - λ) p_model + λ p_cache over the model's own last N positions: the continuous cache
(Grave, Joulin & Usunier 2017) or the count cache (Kuhn & De Mori 1990), read off the stateful pass as it runs.
The formulas, the halves and the cost: docs/evaluation.md, *The cache*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from gru_experiments.data.batches import IGNORE_INDEX
from gru_experiments.files import finite_or_null
from gru_experiments.study.plan import FINAL, Entry, Plan, Request
from gru_experiments.study.scores import (
    Score,
    Split,
    StatefulChunk,
    paired_difference,
    score_stateful,
    score_subset,
)

SMALLEST, LONGEST = 128, 4096  # the cache sizes: powers of 2 from SMALLEST to LONGEST, and the windowed context
SHARPNESS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)  # θ's grid, in units of 1 / the mean squared norm of h
BIGRAM_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # β's grid (the count cache)
LAMBDAS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # λ's grid
CHUNK_ELEMENTS = 1 << 23  # query x key scores per chunk (memory only)
# Under a budget the cache queries every CPU_STRIDE-th position on a CPU (its exponentials are the evaluation's
# costliest part there), a query against N keys priced as N / KEYS_PER_TOKEN forward tokens (docs/evaluation.md).
CPU_STRIDE = 4
KEYS_PER_TOKEN = 256


def cache_stride(positions: int, plan: Plan, on_cpu: bool) -> int:
    """Every how-many-th of the stateful pass's `positions` the continuous cache queries: every one when exact
    (evaluation.budget=null); under a budget at least CPU_STRIDE on a CPU (1 on a GPU), and sparser where its
    queries, LONGEST / KEYS_PER_TOKEN forward tokens each, would cost more than the budget or the plan's passes."""
    if plan.budget is None:
        return 1
    allowance = max(plan.budget, plan.forward_tokens, 1)
    return max(CPU_STRIDE if on_cpu else 1, math.ceil(positions * LONGEST / KEYS_PER_TOKEN / allowance))


@dataclass(frozen=True)
class StreamStates:
    """What the cache keeps of a stateful pass: its chunks (scores.StatefulChunk: rows, length, nll; the features
    as `hidden`, in bfloat16) side by side, (R, L) and (R, L, C) for the whole of every stream it ran."""
    rows: Tensor
    length: int
    nll: Tensor
    hidden: Tensor | None

    @classmethod
    def of_chunk(cls, chunk: StatefulChunk) -> StreamStates:
        hidden = None if chunk.features is None else chunk.features.detach().to(torch.bfloat16)
        return cls(chunk.rows, chunk.length, chunk.nll.float(), hidden)

    @classmethod
    def joined(cls, chunks: list[StreamStates]) -> StreamStates:
        """The chunks side by side, taken out of `chunks` as they are copied: each chunk's memory is freed once
        copied, so the join never holds the states twice (at a gigabyte they are hundreds of MB)."""
        first, width = chunks[0], sum(c.nll.shape[1] for c in chunks)
        nll = first.nll.new_empty(first.nll.shape[0], width)
        hidden = None if first.hidden is None else first.hidden.new_empty(first.hidden.shape[0], width,
                                                                          first.hidden.shape[2])
        rows, length, at = first.rows, first.length, 0
        del first
        chunks.reverse()
        while chunks:
            chunk = chunks.pop()
            t = chunk.nll.shape[1]
            nll[:, at:at + t] = chunk.nll
            if hidden is not None:
                hidden[:, at:at + t] = chunk.hidden
            at += t
        return cls(rows, length, nll, hidden)


def stateful_states(model, split: Split, seq_len: int, streams: int, **kwargs) -> tuple[Score, StreamStates]:
    """score_stateful (its arguments) and the states the cache reads of it, outside an evaluation (the tests,
    benchmarks/bench_cache.py); an evaluation's stateful pass reads them through the plan (CacheEntry)."""
    chunks = []
    score = score_stateful(model, split, seq_len, streams, read=lambda c: chunks.append(StreamStates.of_chunk(c)),
                           **kwargs)
    return score, StreamStates.joined(chunks)


# --- the caches' log p_cache(target), every target at once ----------------------------------------------
def cache_sizes(window: int, longest_history: int) -> list[int]:
    """N: the window (the windowed mode's context) and the powers of 2 from SMALLEST to LONGEST, each below
    `longest_history` (the most positions a target can have before it)."""
    sizes = {window} | {2 ** k for k in range(SMALLEST.bit_length() - 1, LONGEST.bit_length())}
    return sorted(n for n in sizes if n < longest_history)


def continuous_cache(hidden: Tensor, targets: Tensor, sizes: list[int], thetas: list[float],
                     stride: int = 1) -> Tensor:
    """log p_cache(target) (len(sizes), len(thetas), R, ceil(L / stride)), float32, of R segments of L positions
    side by side, at every stride-th position (the queries; every position is a key): hidden (R, L, C) the state
    at each input, targets (R, L) the token after it (the key's value, and the query's target); position p's
    cache: the positions p - N .. p - 1 of its segment (-inf: none holds the target, or none is there). Chunks
    of queries against their last max(sizes) keys, the sizes' sums nested (each band of distances once)."""
    R, L, _ = hidden.shape
    longest, device = max(sizes), hidden.device
    out = torch.full((len(sizes), len(thetas), R, -(-L // stride)), -math.inf, dtype=torch.float32, device=device)
    edges = [0, *sizes]  # band k: distances edges[k] + 1 .. edges[k + 1] (columns edges[k] .. edges[k + 1] - 1)
    # queries per chunk: CHUNK_ELEMENTS' worth of aligned scores, their keys spanning at most 3 x longest
    step = stride * max(1, min(CHUNK_ELEMENTS // max(1, R * longest), 2 * longest // stride))
    distance = torch.arange(1, longest + 1, device=device)
    for a in range(0, L, step):
        b = min(L, a + step)
        k0 = max(0, a - longest)
        at = torch.arange(a, b, stride, device=device)  # the query positions of this chunk
        queries, keys = hidden[:, at].float(), hidden[:, k0:b].float()
        scores = torch.bmm(queries, keys.transpose(1, 2))  # (R, B, W)
        column = (at - k0).unsqueeze(1) - distance  # (B, longest): key p - d, as a column of keys
        valid = column >= 0
        column = column.clamp(min=0).expand(R, -1, -1)
        aligned = scores.gather(2, column)  # (R, B, longest): query p against key p - d, d = 1 .. longest
        match = targets[:, k0:b].gather(1, column.reshape(R, -1)).view_as(column) == targets[:, at].unsqueeze(2)
        hit = match.float()
        a, b = a // stride, a // stride + at.numel()  # the queries' columns of `out`
        for j, theta in enumerate(thetas):
            z = (aligned * theta).masked_fill(~valid, -math.inf)
            den = num = torch.full((R, b - a), -math.inf, device=device)
            for k in range(len(sizes)):  # each band's exponentials once, shifted by its largest (a logsumexp)
                band = z[..., edges[k]:edges[k + 1]]
                top = band.amax(-1, keepdim=True)
                top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
                e = torch.exp(band - top)
                den = torch.logaddexp(den, e.sum(-1).log() + top[..., 0])
                num = torch.logaddexp(num, (e * hit[..., edges[k]:edges[k + 1]]).sum(-1).log() + top[..., 0])
                out[k, j, :, a:b] = torch.where(den > -math.inf, num - den, -math.inf)
    return out


def _mean_square(hidden: Tensor, scored: Tensor, rows: int = 1 << 18) -> float:
    """The mean squared norm of the scored positions' states, `rows` positions at a time in float32 (a long stream
    never whole), each position's norm as at once."""
    flat, kept = hidden.reshape(-1, hidden.shape[-1]), scored.reshape(-1)
    norms = [flat[a:a + rows][kept[a:a + rows]].float().pow(2).sum(-1) for a in range(0, flat.shape[0], rows)]
    return torch.cat(norms).mean().item()


def _count(values: Tensor, queries: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """For each query q: how many j in [lo, hi) have values[j] == q (values (n,) >= 0 or -1: never counted)."""
    n = values.numel()
    order = torch.sort(values * (n + 1) + torch.arange(n, device=values.device)).values
    base = queries * (n + 1)
    return (torch.searchsorted(order, base + hi) - torch.searchsorted(order, base + lo)).double()


def count_cache(ids: Tensor, positions: Tensor, sizes: list[int], weights: list[float]) -> Tensor:
    """log p_cache(ids[u]) (len(sizes), len(weights), U) for the targets at `positions` u (each from ids[:u]): the
    unigram and bigram counts of the last N tokens, ids[u - N : u], mixed by β in `weights`."""
    ids = ids.long()
    vocab = int(ids.max()) + 1
    pairs = torch.cat([ids.new_full((1,), -1), ids[:-1] * vocab + ids[1:]])  # pairs[j] = (ids[j - 1], ids[j])
    u = positions.long()
    out = []
    for n in sizes:
        lo = (u - n).clamp(min=0)
        unigram = _count(ids, ids[u], lo, u) / (u - lo).double()
        context = _count(ids, ids[u - 1], lo, u - 1)  # ids[u - 1] as the first of a pair inside the window
        bigram = _count(pairs, pairs[u], lo + 1, u) / context.clamp(min=1)
        mixed = [torch.where(context > 0, w * bigram + (1 - w) * unigram, unigram) for w in weights]
        out.append(torch.stack(mixed).log())
    return torch.stack(out)


# --- the figures -----------------------------------------------------------------------------------------
def interpolate(model_nll: Tensor, log_cache: Tensor, lam: float) -> Tensor:
    """-log((1 - λ) p_model + λ p_cache), in float64; λ = 0: model_nll itself, exactly."""
    model_nll, log_cache = model_nll.double(), log_cache.double()
    return -torch.logaddexp(math.log1p(-lam) - model_nll,
                            torch.full_like(model_nll, -math.inf) if lam == 0 else math.log(lam) + log_cache)


def _pm(value: float | None, se: float | None) -> str:
    return "" if value is None else f"{value:+.4f} ± {se:.4f}" if se is not None else f"{value:+.4f}"


def cache_figures(states: StreamStates, split: Split, window: int, count: bool = False, stride: int = 1) -> dict:
    """The cache's figures on the second half (summary.json's "cache"), or why there are none, from a stateful pass's
    states (count: the count cache, whatever the states), on every stride-th position of the continuous cache (every
    position a key)."""
    n, ids = split.n_targets, split.ids
    rows, length, device = states.rows, states.length, states.nll.device
    positions = rows.to(device).unsqueeze(1) * length + torch.arange(length, device=device) + 1  # (R, L) targets
    scored = positions <= n
    count = count or states.hidden is None
    if count:
        sizes = cache_sizes(window, n)
        grid = BIGRAM_WEIGHTS
        log_cache = count_cache(ids, positions[scored], sizes, list(grid)) if sizes else None
    else:
        hidden = states.hidden
        targets = torch.where(scored, ids[positions.clamp(max=n)], IGNORE_INDEX)
        if rows.numel() > 1 and bool((rows[1:] - rows[:-1] == 1).all()):  # adjacent streams: one segment
            hidden, targets, scored, positions = (t.reshape(1, -1, *t.shape[2:]) for t in
                                                  (hidden, targets, scored, positions))
        sizes = cache_sizes(window, hidden.shape[1])
        squared = _mean_square(hidden, scored) if sizes else 1.0
        grid = tuple(c / max(squared, 1e-12) for c in SHARPNESS)
        scored = scored & (torch.arange(scored.shape[1], device=device) % stride == 0)  # every stride-th
        queried = scored[:, ::stride]  # the queries continuous_cache scores, of those the scored ones
        log_cache = continuous_cache(hidden, targets, sizes, list(grid), stride)[..., queried] if sizes else None
    if not sizes:
        return {"note": f"no cache size fits: the longest history is under the window ({window})"}
    positions, model_nll = positions[scored], states.nll.reshape(scored.shape)[scored].double()
    cut, halves = n // 2, "split"
    first = int((positions <= cut).sum())
    if 4 * min(first, positions.numel() - first) < positions.numel():  # a sample of few streams: its own halves
        cut, halves = int(positions.median()), "kept targets"
    fit = positions <= cut
    if not bool(fit.any()) or bool(fit.all()):
        return {"note": "too few targets kept to fit on some and score the others"}
    test = torch.zeros(n + 1, dtype=torch.bool, device=device)
    test[cut + 1:] = True
    model = score_subset(Score(positions=positions, target_nll=model_nll), test, split)
    by_size, scored_at = {}, {}
    for k, size in enumerate(sizes):
        lam, j = min(((lam, j) for j in range(len(grid)) for lam in LAMBDAS),
                     key=lambda c: float(interpolate(model_nll[fit], log_cache[k, c[1]][fit], c[0]).sum()))
        cache = score_subset(Score(positions=positions, target_nll=interpolate(model_nll, log_cache[k, j], lam)),
                             test, split)
        scored_at[size] = cache
        gain = paired_difference(cache, model, split)
        past = paired_difference(cache, scored_at[window], split) if size > window else None
        by_size[str(size)] = {"lambda": lam, "parameter": grid[j], "sharpness": None if count else SHARPNESS[j],
                              "bpc": cache.bpc, "gain_bpc": finite_or_null(gain.bpc),
                              "gain_se": finite_or_null(gain.bpc_se),
                              "past_window_bpc": None if past is None else finite_or_null(past.bpc),
                              "past_window_se": None if past is None else finite_or_null(past.bpc_se)}
    return {"kind": "count" if count else "continuous", "window": window, "sizes": sizes, "longest": sizes[-1],
            "halves_of": halves, "every": 1 if count else stride, "fit_targets": int(fit.sum()),
            "test_targets": model.tokens, "model_bpc": model.bpc, "streams_kept": int(rows.numel()),
            "by_size": by_size}


class CacheEntry(Entry):
    """The cache figure of a final evaluation, from what it reads of the stateful pass (its NLLs and final hidden
    states, StreamStates): no pass of its own."""
    name = "cache"

    def reads_stateful(self, request: Request) -> bool:
        return request.purpose == FINAL

    read = staticmethod(StreamStates.of_chunk)

    def run(self, request: Request, plan: Plan, results: list[StreamStates] | None) -> dict:
        if results is None:
            return {"note": "the stateful figure was a sample of windows (a finite-context model under the budget): "
                            "no states kept"}
        states = StreamStates.joined(results)
        split = replace(request.val, ids=request.val.ids.to(states.nll.device))
        stride = cache_stride(states.nll.numel(), plan, states.nll.device.type == "cpu")
        # "Past the window": past the windowed mode's context (evaluation.window; by default the training window).
        return cache_figures(states, split, plan.window, stride=stride)

    def summary(self, record: dict) -> dict:
        longest = str(record.get("longest"))
        at = record.get("by_size", {}).get(longest, {})
        return {"cache_size": record.get("longest"), "cache_gain_bpc": at.get("gain_bpc"),
                "cache_gain_se": at.get("gain_se"), "cache_past_window_bpc": at.get("past_window_bpc"),
                "cache_past_window_se": at.get("past_window_se"), "cache": record}

    def describe(self, r: dict) -> str:
        if "by_size" not in r:
            return f"cache: not measured ({r['note']})"
        parameter = "θ" if r["kind"] == "continuous" else "β"
        every = f" (every {r['every']}th)" if r["every"] > 1 else ""
        lines = [f"{r['kind']} cache over the last N tokens, λ and {parameter} fitted on the first half of the "
                 f"{r['halves_of']} ({r['fit_targets']:,} targets{every}), scored on the second ({r['test_targets']:,};"
                 f" the model alone {r['model_bpc']:.4f} bits/char); gain: cache - model, past the window: cache(N) - "
                 f"cache({r['window']}), paired:",
                 f"{'N':>6} {'λ':>5} {parameter:>8} {'bits/char':>10} {'gain':>16} {'past the window':>18}"]
        for n, f in r["by_size"].items():
            past = "" if f["past_window_bpc"] is None else _pm(f["past_window_bpc"], f["past_window_se"])
            lines.append(f"{n:>6} {f['lambda']:>5.2f} {f['parameter']:>8.3g} {f['bpc']:>10.4f} "
                         f"{_pm(f['gain_bpc'], f['gain_se']):>16} {past:>18}")
        return "\n".join(lines)
