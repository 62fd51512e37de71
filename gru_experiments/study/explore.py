"""What one run's page shows (sample.py explore=true; the page: explore_page.py; docs/explore.md):
surprisal by mode, the hidden units and what they follow, the probe's key held or let go
(docs/internals.md, *The run's page*). Every function takes a model and token ids, never a run.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gru_experiments.models.protocol import map_state
from gru_experiments.study.generation import eval_mode, plain_logits
from gru_experiments.study.modes import MODES_BY_CONTEXT, STATEFUL, STATELESS, WINDOWED
from gru_experiments.study.scores import (
    Score,
    Split,
    score_stateful,
    score_table,
    score_windowed,
    stateless_log_probs,
)
from gru_experiments.study.text_index import is_word_char

TOP_K = 5  # predictions shown per token and mode
LET_GO_FRACTION = 0.25  # a unit lets go of a key when its spread stays under this share of its peak
OPENING_BRACKETS, CLOSING_BRACKETS, QUOTE = "([{", ")]}", '"'


def surprisal(model, split: Split, seq_len: int, window: int,
              table: Tensor) -> tuple[dict[str, Score], dict[str, Tensor]]:
    """Each mode's Score over the text and the bits of every token ((N,) float64; the first is nan), from the
    evaluation's scoring functions: stateful (one stream in chunks of seq_len), windowed (the last `window`
    tokens), stateless (`table`: stateless_log_probs)."""
    scores = {STATEFUL: score_stateful(model, split, seq_len, streams=1, targets_after=0),
              WINDOWED: score_windowed(model, split, window, targets=True),
              STATELESS: score_table(table, split, targets=True)}
    bits = {}
    for mode, score in scores.items():
        bits[mode] = torch.full((split.ids.numel(),), math.nan, dtype=torch.float64)
        bits[mode][score.positions.cpu()] = score.target_nll.cpu() / math.log(2)
    return scores, bits


# --- the hidden units ---------------------------------------------------------------------------

def layer_sizes(model) -> list[int]:
    """The sizes of a recurrent model's layers (units whose state carries from step to step, the protocol's
    `state_units`); [] for others."""
    if not model.recurrent:
        return []
    return [units.shape[-1] for units in model.state_units(model.initial_state(1, model.device))]


def unit_chunks(model, ids: Tensor, seq_len: int, state=None):
    """scores.carried_chunks, yielding each chunk's logits and a recurrent model's units (B, t, U; else None),
    from the protocol's `unit_states`."""
    with eval_mode(model):
        for start in range(0, ids.shape[1], seq_len):
            with torch.no_grad():
                logits, state, units = model.unit_states(ids[:, start:start + seq_len], state)
            yield logits.float(), torch.cat(units, dim=2).float() if units else None


def unit_pass(model, ids: Tensor, seq_len: int) -> tuple[Tensor, Tensor | None]:
    """unit_chunks over the whole of ids (B, T): logits (B, T, V) and units (B, T, U) or None."""
    logits, units = zip(*unit_chunks(model, ids, seq_len))
    return torch.cat(logits, dim=1), None if units[0] is None else torch.cat(units, dim=1)


def text_features(tokens: list[str]) -> dict[str, Tensor]:
    """Per token (the features at its first character), from the text alone:
        quote          1 inside a double quotation or brackets ((), [], {}, nested), the marks included
        line_position  characters since the last newline (0 at a line's first character)
        in_word        1 on a letter, or an apostrophe between two letters (o'er)"""
    text = "".join(tokens)
    quote, column, word = [], [], []
    depth, quoted, col = 0, False, 0
    for i, c in enumerate(text):
        if c == QUOTE:
            quoted = not quoted
        depth += c in OPENING_BRACKETS
        quote.append(float(depth > 0 or quoted or c == QUOTE or c in CLOSING_BRACKETS))
        depth = max(depth - (c in CLOSING_BRACKETS), 0)
        column.append(float(col))
        col = 0 if c == "\n" else col + 1
        word.append(float(is_word_char(text, i)))
    starts = torch.tensor([0] + [len(t) for t in tokens[:-1]]).cumsum(0)
    return {name: torch.tensor(values)[starts]
            for name, values in (("quote", quote), ("line_position", column), ("in_word", word))}


def correlation_ranking(units: Tensor, feature: Tensor) -> Tensor:
    """|Pearson r| of every unit (units: (T, U)) with the feature (T,); 0 where either does not vary."""
    x = units.double() - units.double().mean(0)
    y = feature.double() - feature.double().mean()
    norm = x.norm(dim=0) * y.norm()
    r = (x * y.unsqueeze(1)).sum(0) / norm
    return torch.where(norm > 0, r.abs(), torch.zeros_like(r)).float()


# --- the probe's key ------------------------------------------------------------------------------

@torch.no_grad()
def key_spread(model, ids: Tensor, first_key: int, keys: Tensor, length: int, seq_len: int) -> Tensor:
    """What every unit carries of the key at `first_key` in ids (N,): the standard deviation, over one run
    per key symbol in `keys` (K,) put there, of every unit at every lag up to `length`: (length, U)."""
    state = None  # the initial state: a key at the text's start
    if first_key:
        with eval_mode(model):
            _, state = model(ids[None, :first_key])
        state = map_state(lambda s: s.expand(keys.numel(), *s.shape[1:]).contiguous(), state)  # a row per key
    variants = ids[first_key:first_key + length].repeat(keys.numel(), 1)
    variants[:, 0] = keys
    # Reduced chunk by chunk: K runs of a long text at every unit would not fit a big model's memory.
    return torch.cat([units.std(dim=0, unbiased=False).cpu()
                      for _, units in unit_chunks(model, variants, seq_len, state)])


def let_go(spread: Tensor) -> list[int | None]:
    """Per unit (spread: (L, U)): the first lag from which its spread stays under LET_GO_FRACTION of its
    peak (0: the key never moves it); None when it still holds at L."""
    above = (spread >= LET_GO_FRACTION * spread.max(dim=0).values) & (spread > 0)  # a unit blind to it: 0
    lags = torch.arange(spread.shape[0]).unsqueeze(1).expand_as(above)
    last = torch.where(above, lags, torch.full_like(lags, -1)).max(dim=0).values + 1
    return [None if int(v) >= spread.shape[0] else int(v) for v in last]


def key_ranking(spreads: list[Tensor], spans: list[int], scale: Tensor) -> Tensor:
    """Each unit's key spread over lags 1..span, averaged over the pairs, over its own sd (`scale`, (U,))."""
    held = torch.stack([s[1:span + 1].mean(0) for s, span in zip(spreads, spans)]).mean(0)
    return torch.where(scale > 0, held / scale.clamp(min=1e-12), torch.zeros_like(held))


# --- everything the page shows ----------------------------------------------------------------------

@dataclass
class PlantedText:
    """The planted pairs of the text (a data.recall_probe.Planting of it), the K key symbols' ids, and
    `hold_ids`: ⟪ k followed by plain text and never closed, for how long a unit holds a key unasked."""

    planting: object
    keys: Tensor
    hold_ids: Tensor


def explore(model, tokenizer, ids: Tensor, *, seq_len: int, window: int, probe: PlantedText | None = None,
            ranked: int = 12) -> dict:
    """The page's content for the text `ids` (N,): tokens, every mode's bits, the top predictions; for a
    recurrent model the activations and unit rankings; with a probe, the pairs and the key's holders."""
    split = Split.of(ids, tokenizer)  # a planted text: over the whole vocabulary; plain text: its own symbols
    table = stateless_log_probs(model, split.plain)
    scores, bits = surprisal(model, split, seq_len, window, table)
    logits, units = unit_pass(model, ids[None], seq_len)
    pieces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    data = {"tokens": [pieces[i] for i in ids.tolist()], "family": model.family, "window": window,
            "seq_len": seq_len, "modes": list(MODES_BY_CONTEXT),
            "bpc": {mode: scores[mode].bpc for mode in MODES_BY_CONTEXT},
            "bits": {mode: [None if math.isnan(b) else round(b, 3) for b in bits[mode].tolist()]
                     for mode in MODES_BY_CONTEXT},
            "top": {STATEFUL: top_predictions(plain_logits(logits[0, :-1], split.plain).log_softmax(-1), pieces),
                    STATELESS: top_predictions(table[ids[:-1]].float(), pieces)},
            "layers": layer_sizes(model), "rankings": {}, "recall": None}
    if units is not None:
        units = units[0].cpu()
        features = text_features(data["tokens"])
        # A feature constant over the text ranks nothing (Tiny Shakespeare has no quotes or brackets).
        data["constant"] = [name for name, f in features.items() if bool((f == f[0]).all())]
        rankings = {name: correlation_ranking(units, f) for name, f in features.items() if name not in data["constant"]}
        if probe is not None:
            data["recall"], rankings["key"] = recall_units(model, ids, probe, units.std(0), seq_len, ranked)
        data["activations"] = units
        data["rankings"] = {name: top_units(score, data["layers"], ranked) for name, score in rankings.items()}
    if probe is not None:
        recall = data["recall"] or {}
        carriers = recall.pop("carriers", None)
        data["recall"] = {**recall, "keys": probe.keys.numel(), "chance_bits": math.log2(probe.keys.numel()),
                          "pairs": pair_rows(probe, data["tokens"], bits, carriers)}
    return data


def top_predictions(log_probs: Tensor, pieces: list[str]) -> list:
    """Per token (the first: None), its TOP_K most probable tokens [[piece, p], ...] from log_probs (N - 1, V)."""
    values, indices = log_probs.topk(min(TOP_K, log_probs.shape[-1]), dim=-1)
    rows = [[[pieces[i], round(math.exp(v), 3)] for v, i in zip(vs, ix)]
            for vs, ix in zip(values.tolist(), indices.tolist())]
    return [None, *rows]


def top_units(score: Tensor, sizes: list[int], count: int) -> list:
    """The `count` best units by score: [[layer, unit within it, score], ...] (indices from 0)."""
    address = [(layer, unit) for layer, size in enumerate(sizes) for unit in range(size)]
    return [[*address[u], round(float(score[u]), 4)] for u in score.argsort(descending=True)[:count].tolist()]


def recall_units(model, ids: Tensor, probe: PlantedText, scale: Tensor, seq_len: int,
                 ranked: int) -> tuple[dict, Tensor]:
    """The units that hold the key (key_ranking), each pair's carriers at the closing marker, and where the
    best `ranked` units let go of a key never asked for (probe.hold_ids)."""
    planting, sizes, keys = probe.planting, layer_sizes(model), probe.keys.to(ids.device)
    spans = [int(d) + 1 for d in planting.distances]
    spreads = [key_spread(model, ids, int(f), keys, span + 1, seq_len) for f, span in zip(planting.first_key, spans)]
    ranking = key_ranking(spreads, spans, scale)
    held = key_spread(model, probe.hold_ids.to(ids.device), 1, keys, probe.hold_ids.numel() - 1, seq_len)
    released = let_go(held)
    best = ranking.argsort(descending=True)[:ranked].tolist()  # top_units' order
    carriers = [top_units(s[span] / scale.clamp(min=1e-12), sizes, 3) for s, span in zip(spreads, spans)]
    return {"holders": [[*row, released[u]] for row, u in zip(top_units(ranking, sizes, ranked), best)],
            "hold_length": probe.hold_ids.numel() - 2, "carriers": carriers}, ranking  # the tokens after ⟪ k


def pair_rows(probe: PlantedText, tokens: list[str], bits: dict[str, Tensor], carriers: list | None) -> list[dict]:
    """One row per planted pair: where, its distance, its key, its recall's bits per mode, its carriers."""
    planting, keys = probe.planting, probe.keys.tolist()
    # key_index: the key's number among the K, for a browser without a font for the key symbols.
    return [{"first": int(f), "recall": int(r), "distance": int(d), "key": tokens[int(f)],
             "key_index": keys.index(int(planting.keys[i])),
             "bits": {mode: round(float(bits[mode][int(r)]), 3) for mode in MODES_BY_CONTEXT},
             "carriers": carriers[i] if carriers else []}
            for i, (f, r, d) in enumerate(zip(planting.first_key, planting.recall, planting.distances))]
