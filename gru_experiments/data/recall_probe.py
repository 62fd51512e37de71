"""The planted-recall probe (probe=recall): pairs planted in a split's token ids (char tokenizer only)
to measure how far back a model recalls a symbol it saw once.

A pair, token by token:

    ⟪  k  t_1 ... t_d  ⟫  k

    ⟪ ⟫   the opening and closing markers: characters the corpus does not contain
    k     a key: one of K symbols the corpus does not contain (probe.keys), drawn uniformly, the same twice
    t_i   d tokens of the text, untouched (d: the pair's distance, from probe.distances)

The recall target is the second k, d + 2 positions after the first. A model that remembers the first k
names it; one without memory can do no better than log2 K bits.

A planting (`plant`) follows these rules:
- balanced: the pairs take the distances in a freshly shuffled order, cycle after cycle, so every
  distance gets (nearly) the same count;
- sparse and never overlapping: before each pair, a gap of plain text drawn uniformly from
  [gap, 2 gap] tokens (probe.gap);
- inserted, then cut: the markers and keys are inserted (4 tokens a pair, the text around them
  untouched) and the result is cut to the split's length, so a planted split has exactly the length
  of the plain one; a pair that would not end inside the cut is not planted;
- seeded: planting p of a split uses a generator seeded from (seed, split name, p) (`planting_generator`).

The training split is planted afresh at every pass, with new keys in new places (`PlantedSplit`), so a
key can only be recalled, never memorised. The validation split stays plain for the ordinary figures;
the recall figures are scored on R plantings of it, R the fewest that give every distance
probe.min_targets recall targets (`validation_plantings`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
from omegaconf import OmegaConf
from torch import Tensor

from gru_experiments.data.tokenizers import _private_use_chars
from gru_experiments.errors import UserError
from gru_experiments.validation import Rule, check_rules, int_at_least, is_int

NEEDS_CHAR = "probe=recall needs tokenizer=char: the pairs are planted character by character"
MARKERS = ("\u27ea", "\u27eb")  # ⟪ ⟫
# Ⓐ..Ⓩ then ⓐ..ⓩ: visible in a decoded sample; private-use characters after them.
KEY_CHARS = tuple(chr(c) for c in range(0x24B6, 0x24B6 + 26)) + tuple(chr(c) for c in range(0x24D0, 0x24D0 + 26))
MAX_KEYS = 1024
MAX_VALIDATION_PLANTINGS = 256  # the recall figures' cost stays bounded on a short validation split


def distinct_positive_ints(value) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
            and all(is_int(d) and d >= 1 for d in value) and len(set(value)) == len(value))


PROBE_RULES = [
    Rule("probe.keys", lambda v: is_int(v) and 2 <= v <= MAX_KEYS, f"an integer from 2 to {MAX_KEYS}"),
    Rule("probe.distances", distinct_positive_ints,
         "a non-empty list of distinct integers >= 1 (the text tokens between a key and the closing marker)"),
    Rule("probe.gap", int_at_least(1), "an integer >= 1 (plain text before each pair: [gap, 2 gap] tokens)"),
    Rule("probe.min_targets", int_at_least(1), "an integer >= 1 (validation recall targets per distance)"),
]


@dataclass(frozen=True)
class ProbeSettings:
    """What conf/probe/recall.yaml sets (checked with PROBE_RULES)."""

    keys: int = 16
    distances: tuple[int, ...] = (16, 48, 96, 192, 384, 768, 1536)
    gap: int = 64
    min_targets: int = 100

    def __post_init__(self):
        check_rules({"probe": {f.name: getattr(self, f.name) for f in fields(self)}}, PROBE_RULES)
        object.__setattr__(self, "distances", tuple(self.distances))

    @classmethod
    def from_config(cls, probe_cfg) -> ProbeSettings | None:
        """The settings of a `probe` config group; None for probe=none or no group at all."""
        if probe_cfg is None:
            return None
        values = OmegaConf.to_container(probe_cfg) if OmegaConf.is_config(probe_cfg) else dict(probe_cfg)
        if values.pop("name", "recall") == "none":
            return None
        check_rules({"probe": values}, PROBE_RULES)
        return cls(**values)


class ProbeSymbols(NamedTuple):
    """The probe's characters: none of them occurs in the corpus."""

    opening: str
    closing: str
    keys: tuple[str, ...]


class SymbolIds(NamedTuple):
    """The probe's characters as token ids."""

    opening: int
    closing: int
    keys: Tensor  # (K,) int64

    @classmethod
    def of(cls, symbols: ProbeSymbols, tokenizer) -> SymbolIds:
        opening, closing = tokenizer.encode(symbols.opening + symbols.closing)
        return cls(opening, closing, torch.tensor(tokenizer.encode("".join(symbols.keys)), dtype=torch.long))


def probe_symbols(text: str, keys: int) -> ProbeSymbols:
    """The markers ⟪ ⟫ and `keys` keys from Ⓐ..Ⓩ ⓐ..ⓩ, each skipped if `text` contains it and then
    replaced by a private-use character that neither `text` nor an earlier symbol uses."""
    taken = set(text)

    def pick(preferred: Sequence[str], count: int) -> list[str]:
        chosen = [c for c in preferred if c not in taken][:count]
        chosen += _private_use_chars("".join(taken) + "".join(chosen), count - len(chosen))
        taken.update(chosen)
        return chosen

    opening, closing = pick(MARKERS[:1], 1)[0], pick(MARKERS[1:], 1)[0]
    return ProbeSymbols(opening, closing, tuple(pick(KEY_CHARS, keys)))


@dataclass
class Planting:
    """One planting of a split: the planted ids and where its P pairs are."""

    ids: Tensor  # (N,) the planted split, as long as the plain one
    first_key: Tensor  # (P,) the position in ids of each pair's first key
    recall: Tensor  # (P,) the position of its recalled (second) key: first_key + distances + 2
    distances: Tensor  # (P,) d of each pair
    keys: Tensor  # (P,) the key's token id: ids[first_key] == ids[recall] == keys

    def to(self, device) -> Planting:
        return Planting(*(getattr(self, f.name).to(device) for f in fields(self)))


def planting_generator(seed: int, split: str, planting: int) -> torch.Generator:
    """The generator of planting `planting` of split `split` in a run seeded `seed`."""
    digest = hashlib.sha256(f"{seed}/{split}/{planting}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def plant(ids: Tensor, settings: ProbeSettings, symbols: SymbolIds, generator: torch.Generator) -> Planting:
    """Plant pairs in `ids` (on CPU; see the module docstring for the rules): vectorised, no loop over tokens."""
    ids, n = ids.cpu(), ids.numel()
    distances = torch.tensor(settings.distances)
    # No pair takes fewer than gap + min(d) + 4 tokens: this many pairs always fill the split.
    m = n // (settings.gap + int(distances.min()) + 4) + 1
    cycles = -(-m // len(distances))
    order = torch.rand(cycles, len(distances), generator=generator).argsort(dim=1)  # a shuffle per cycle
    d = distances[order.flatten()[:m]]
    gaps = torch.randint(settings.gap, 2 * settings.gap + 1, (m,), generator=generator)
    keys = symbols.keys[torch.randint(len(symbols.keys), (m,), generator=generator)]
    ends = torch.cumsum(gaps + d + 4, 0)  # just past each pair, in the planted split
    kept = int((ends <= n).sum())  # ends increase: the pairs that fit are a prefix
    d, keys = d[:kept], keys[:kept]
    first_key = ends[:kept] - d - 3
    recall = first_key + d + 2
    planted = torch.empty(n, dtype=ids.dtype)
    inserted = torch.zeros(n, dtype=torch.bool)
    for positions, values in ((first_key - 1, symbols.opening), (first_key, keys),
                              (recall - 1, symbols.closing), (recall, keys)):
        planted[positions] = values
        inserted[positions] = True
    text = ~inserted
    planted[text] = ids[: n - 4 * kept]  # the text, in order, around the inserted tokens
    return Planting(planted, first_key, recall, d, keys)


class PlantedSplit:
    """A split planted afresh at every pass: pass p reads planting p of (seed, name). Called with a
    pass, it gives that pass's ids (on CPU; the batches move them); the last planting is kept."""

    def __init__(self, ids: Tensor, settings: ProbeSettings, symbols: SymbolIds, seed: int, name: str = "train"):
        self.ids, self.settings, self.symbols, self.seed, self.name = ids.cpu(), settings, symbols, seed, name
        self._last: tuple[int, Planting] | None = None

    def planting(self, pass_index: int) -> Planting:
        if self._last is None or self._last[0] != pass_index:
            generator = planting_generator(self.seed, self.name, pass_index)
            self._last = (pass_index, plant(self.ids, self.settings, self.symbols, generator))
        return self._last[1]

    def ids_for_pass(self, pass_index: int) -> Tensor:
        return self.planting(pass_index).ids

    __call__ = ids_for_pass


def targets_per_distance(plantings: list[Planting], distances: Sequence[int]) -> list[int]:
    """How many recall targets the plantings hold at each distance."""
    d = torch.cat([p.distances for p in plantings]) if plantings else torch.zeros(0, dtype=torch.long)
    return [int((d == distance).sum()) for distance in distances]


def validation_plantings(val_ids: Tensor, settings: ProbeSettings, symbols: SymbolIds, seed: int,
                         name: str = "validation") -> list[Planting]:
    """Plantings 0, 1, ... of the validation split until every distance has settings.min_targets
    recall targets (at most MAX_VALIDATION_PLANTINGS of them). UserError if the split has no room
    for one pair of the longest distance whatever its gap."""
    longest, n = max(settings.distances), val_ids.numel()
    if n < 2 * settings.gap + longest + 4:
        raise UserError(f"probe=recall: the validation split has {n} tokens, too few for one pair at distance "
                        f"{longest} (2 x probe.gap + {longest} + 4 = {2 * settings.gap + longest + 4}); use a longer "
                        "corpus, a smaller data.train_fraction, a smaller probe.gap or shorter probe.distances")
    plantings: list[Planting] = []
    counts = torch.zeros(len(settings.distances), dtype=torch.long)
    distances = torch.tensor(settings.distances)
    while int(counts.min()) < settings.min_targets and len(plantings) < MAX_VALIDATION_PLANTINGS:
        plantings.append(plant(val_ids, settings, symbols, planting_generator(seed, name, len(plantings))))
        counts += (plantings[-1].distances[:, None] == distances).sum(0)
    return plantings


@dataclass
class Probe:
    """The probe of a run (Corpus.probe): its settings, characters, the training split planted per pass
    and the validation split's plantings for the recall figures."""

    settings: ProbeSettings
    symbols: ProbeSymbols
    symbol_ids: SymbolIds
    train: PlantedSplit
    validation: list[Planting]

    @classmethod
    def build(cls, settings: ProbeSettings, symbols: ProbeSymbols, tokenizer, train_ids: Tensor, val_ids: Tensor,
              seed: int) -> Probe:
        ids = SymbolIds.of(symbols, tokenizer)
        return cls(settings, symbols, ids, PlantedSplit(train_ids, settings, ids, seed),
                   validation_plantings(val_ids, settings, ids, seed))
