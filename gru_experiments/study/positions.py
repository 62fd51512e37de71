"""Which targets a pass scores: the one home of the target-position arithmetic. The plan counts these
ranges (passes.py, before anything runs) and the scoring runs over them (scores.py), so the two agree
by construction (docs/evaluation.md)."""

from __future__ import annotations


def congruent(low: int, high: int, residue: int, stride: int) -> range:
    """The integers u in [low, high] with u = residue (mod stride), ascending (len() counts them)."""
    if high < low:
        return range(0)
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


def warm_targets(n: int, streams: int, stride: int, after: int, every: int = 1) -> int:
    """How many targets of every stride-th stream have at least `after` tokens of their stream before
    them (those a stateful pass keeps for a paired difference), counting only u = 1 (mod every)."""
    streams, length = stream_layout(n, streams)
    return sum(len(congruent(s * length + after + 1, min((s + 1) * length, n), 1, every))
               for s in range(0, streams, stride))
