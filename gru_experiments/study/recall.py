"""The planted-recall figures (data/recall_probe.py): the bits spent on a recalled key by distance in each
mode, and each mode's horizon; exact, outside the budget (docs/evaluation.md#the-planted-recall-control).
"""

import math
from dataclasses import dataclass
from itertools import takewhile
from typing import ClassVar

import torch
from torch import Tensor

from gru_experiments.study.generation import NO_PROGRESS, Progress
from gru_experiments.study.modes import MODES_BY_CONTEXT, STATEFUL
from gru_experiments.study.plan import FINAL, OTHER, Entry, Pass, Request, Unit, figure_of
from gru_experiments.study.scores import carried_chunks, chunks_cost, stateless_log_probs, target_nll, window_batches

ORDINARY_FIGURES = ("the ordinary figures are scored on the validation split unplanted, so none of their targets is "
                    "part of a pair; the recall figures on {plantings} independent plantings of it")


def stateful_log_probs(model, ids: Tensor, rows: Tensor, positions: Tensor, seq_len: int, tick=None) -> Tensor:
    """log p of ids[row, position] with the state carried from each row's start."""
    out = torch.empty(rows.numel(), dtype=torch.float64)
    for start, logits, _ in carried_chunks(model, ids, seq_len, end=ids.shape[1] - 1, tick=tick):
        here = (positions > start) & (positions <= start + logits.shape[1])
        if here.any():
            row, position = rows[here], positions[here]
            out[here] = -target_nll(logits[row, position - 1 - start], ids[row, position]).double().cpu()
    return out


def windowed_log_probs(model, ids: Tensor, rows: Tensor, positions: Tensor, window: int, tick=None) -> Tensor:
    """log p of ids[row, position] from the `window` tokens before it, from the initial state."""
    out, lengths = torch.empty(rows.numel(), dtype=torch.float64), positions.clamp(max=window)
    for length in lengths.unique().tolist():
        group = torch.nonzero(lengths == length).squeeze(1)
        for batch, logits in window_batches(model, ids, positions[group], length, rows[group], tick):
            chosen = group[batch]
            out[chosen] = -target_nll(logits[:, -1], ids[rows[chosen], positions[chosen]]).double().cpu()
    return out


def score_recall(model, plantings, *, seq_len: int, window: int, keys: int, progress: Progress = NO_PROGRESS) -> dict:
    """The recall record (summary.json's `recall`): the bits per recalled key by distance and mode; horizons."""
    device = model.device
    ids = torch.stack([p.ids for p in plantings]).to(device)
    rows = torch.cat([torch.full_like(p.recall, r) for r, p in enumerate(plantings)]).to(device)  # every target's
    positions, distances = (torch.cat([getattr(p, k) for p in plantings]).to(device) for k in ("recall", "distances"))
    if model.context is None:
        with progress.phase(f"recall, stateful ({len(plantings)} plantings)", ids.numel()) as tick:
            stateful = stateful_log_probs(model, ids, rows, positions, seq_len, tick)
    else:  # a function of its last `context` tokens: stateful is that window, scored per target (exactly)
        with progress.phase(f"recall, stateful (the last {model.context} tokens)",
                            int(positions.clamp(max=model.context).sum())) as tick:
            stateful = windowed_log_probs(model, ids, rows, positions, model.context, tick)
    with progress.phase(f"recall, windowed ({rows.numel():,} targets)",
                        int(positions.clamp(max=window).sum())) as tick:
        windowed = windowed_log_probs(model, ids, rows, positions, window, tick)
    table = stateless_log_probs(model)
    stateless = table[ids[rows, positions - 1], ids[rows, positions]].double().cpu()
    bits = {mode: -lp / math.log(2) for mode, lp in zip(MODES_BY_CONTEXT, (stateful, windowed, stateless))}
    distances = distances.cpu()
    by_distance = {str(d): {mode: bits_and_se(bits[mode][distances == d]) for mode in MODES_BY_CONTEXT}
                   for d in sorted(set(distances.tolist()))}
    return {"keys": keys, "chance_bits": math.log2(keys), "distances": sorted(set(distances.tolist())),
            "plantings": len(plantings), "seq_len": seq_len, "window": window, "by_distance": by_distance,
            "horizon": {mode: horizon(by_distance, mode) for mode in MODES_BY_CONTEXT},
            "forward_tokens": recall_forward_tokens(model, plantings, seq_len, window),
            "note": ORDINARY_FIGURES.format(plantings=len(plantings))}


def recall_forward_tokens(model, plantings, seq_len: int, window: int) -> int:
    """The forward tokens score_recall runs, counted without running it."""
    positions = torch.cat([p.recall for p in plantings])
    def per_target(w: int) -> int:
        lengths, counts = positions.clamp(max=w).unique(return_counts=True)
        return sum(int(c) * model.forward_cost(0, int(n)) for n, c in zip(lengths, counts))
    length = plantings[0].ids.numel()
    stateful = (len(plantings) * chunks_cost(model, length, seq_len, end=length - 1)
                if model.context is None else per_target(model.context))
    return stateful + per_target(window) + model.vocab_size * model.forward_cost(0, 1)


REMEMBERED_BITS = 1.0  # the horizon: every distance up to it recalled in under this many bits
CROSSING_BITS = 2.0  # and where the curve crosses this many (log2 K = 4 for the default 16 keys)


def horizon(by_distance: dict, mode: str) -> dict:
    """A mode's memory horizon from its recall curve (by_distance: distance -> mode -> {"bits", ...}):
    `remembered`, the longest distance up to which every recall is under REMEMBERED_BITS, and
    `crosses_2_bits`, where the curve first rises through CROSSING_BITS (interpolated in log2 distance;
    None when it never does, `crossing` saying why)."""
    curve = sorted((int(d), figures[mode]["bits"]) for d, figures in by_distance.items()
                   if figures[mode]["bits"] is not None)
    below = [d for d, _ in takewhile(lambda point: point[1] < REMEMBERED_BITS, curve)]
    remembered = below[-1] if below else None
    crossed, crossing = None, "below 2 bits at every distance"
    if curve and curve[0][1] >= CROSSING_BITS:
        crossing = "2 bits or more at the shortest distance"
    else:
        for (d0, b0), (d1, b1) in zip(curve, curve[1:]):
            if b0 < CROSSING_BITS <= b1:
                x = math.log2(d0) + (CROSSING_BITS - b0) / (b1 - b0) * (math.log2(d1) - math.log2(d0))
                crossed, crossing = 2 ** x, "interpolated in log2 distance"
                break
    return {"remembered": remembered, "crosses_2_bits": crossed, "crossing": crossing}


def bits_and_se(bits: Tensor) -> dict:
    n = bits.numel()
    se = float(bits.std(unbiased=True) / math.sqrt(n)) if n > 1 else None
    return {"bits": float(bits.mean()) if n else None, "se": se, "targets": n}


def format_recall(record: dict) -> str:
    """The recall record for the log: a row per distance, bits ± se in each mode."""
    lines = [f"planted recall: bits per recalled key ({record['keys']} keys: {record['chance_bits']:.2f} bits without "
             f"memory), {record['plantings']} plantings; windowed: the last {record['window']} tokens",
             f"{'distance':>8} " + " ".join(f"{mode:>16}" for mode in MODES_BY_CONTEXT) + f" {'targets':>8}"]
    for d, figures in record["by_distance"].items():
        cells = " ".join(f"{figures[m]['bits']:>8.3f} ±{figures[m]['se'] or 0:<6.3f}" for m in MODES_BY_CONTEXT)
        lines.append(f"{d:>8} {cells} {figures[STATEFUL]['targets']:>8}")
    for mode, h in record["horizon"].items():
        crossed = h["crosses_2_bits"]
        lines.append(f"{mode} horizon: under 1 bit up to d = {h['remembered'] or 'none'}; 2 bits crossed at "
                     + (f"d = {crossed:,.0f} ({h['crossing']})" if crossed else h["crossing"]))
    return "\n".join(lines)


@dataclass(frozen=True)
class RecallPass(Pass):
    """Every recall target of every planting, in the three modes (score_recall): exact, outside the budget."""
    kind: ClassVar[str] = "recall"

    def run(self, request, progress=NO_PROGRESS) -> dict:
        probe, s = request.probe, request.settings
        return {None: score_recall(request.model, list(probe.validation), seq_len=s.seq_len, window=s.window,
                                   keys=probe.settings.keys, progress=progress)}


class RecallEntry(Entry):
    """The planted-recall figures of a probe run (summary.json's `recall`), at the end of the run."""
    name = "recall"

    def units(self, request: Request) -> list[Unit]:
        probe, s = request.probe, request.settings
        if probe is None or request.purpose != FINAL:
            return []
        plantings = tuple(probe.validation)
        recall = RecallPass(sum(p.recall.numel() for p in plantings),
                            recall_forward_tokens(request.model, plantings, s.seq_len, s.window))
        return [Unit(lambda stride: [recall], lambda ps, i: [figure_of(self.name, None, 0, ps, None, i, kind=OTHER)],
                     True, priority=90, owner=self.name)]

    describe = staticmethod(format_recall)
