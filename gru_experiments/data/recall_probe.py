"""The planted-recall probe (probe=recall): how far back a model recalls a symbol it saw once, from pairs
`⟪ k t_1 ... t_d ⟫ k` planted in a split. The rules: docs/internals.md, *The planted-recall probe*."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
from omegaconf import OmegaConf
from torch import Tensor

from gru_experiments.data.tokenizers import _private_use_chars
from gru_experiments.errors import UserError
from gru_experiments.validation import Rule, check_rules, fraction, int_at_least, is_int

NEEDS_CHAR = "probe=recall needs tokenizer=char: the pairs are planted character by character"
MARKERS = ("\u27ea", "\u27eb")  # ⟪ ⟫
# Ⓐ..Ⓩ then ⓐ..ⓩ: visible in a decoded sample; private-use characters after them.
KEY_CHARS = tuple(chr(c) for c in range(0x24B6, 0x24B6 + 26)) + tuple(chr(c) for c in range(0x24D0, 0x24D0 + 26))
MAX_KEYS = 1024
MAX_VALIDATION_PLANTINGS = 256  # the recall figures' cost stays bounded on a short validation split


def distinct_positive_ints(value) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
            and all(is_int(d) and d >= 1 for d in value) and len(set(value)) == len(value))


PAIRS_RULES = [
    Rule("distances", distinct_positive_ints,
         "a non-empty list of distinct integers >= 1 (the text tokens between a key and the closing marker)"),
    Rule("gap", int_at_least(1), "an integer >= 1 (plain text before each pair: [gap, 2 gap] tokens)"),
]
PHASE_RULES = [*PAIRS_RULES, Rule("start", fraction,
                                  "a number in [0, 1): the fraction of the run's steps where the phase starts")]
KEYS_RULE = Rule("keys", lambda v: is_int(v) and 2 <= v <= MAX_KEYS, f"an integer from 2 to {MAX_KEYS}")
VALIDATION_RULES = [*PAIRS_RULES, Rule("min_targets", lambda v: is_int(v) and 1 <= v <= 100_000,
                                       "an integer from 1 to 100000 (validation recall targets per distance)")]


@dataclass(frozen=True)
class Pairs:
    """How one planting places its pairs: the distances, balanced, and [gap, 2 gap] tokens before each."""

    distances: tuple[int, ...]
    gap: int

    def __post_init__(self):
        object.__setattr__(self, "distances", tuple(self.distances))


@dataclass(frozen=True)
class Phase(Pairs):
    """A training phase: its pairs, planted from `start` (a fraction of the run's steps) on."""

    start: float = 0.0


@dataclass(frozen=True)
class ValidationPairs(Pairs):
    """The validation split's pairs, planted until every distance has `min_targets` recall targets."""

    min_targets: int = 200


def _checked(cls, values, key: str):
    names = [f.name for f in fields(cls)]
    if not isinstance(values, Mapping):
        raise UserError(f"invalid {key}={values!r}: must be a mapping of {', '.join(names)}")
    check_rules(values, {Phase: PHASE_RULES, ValidationPairs: VALIDATION_RULES}[cls], f"{key}.", known=names)
    return cls(**values)


def _checked_phases(phases) -> tuple[Phase, ...]:
    if not isinstance(phases, Sequence) or isinstance(phases, str) or not phases:
        raise UserError(f"invalid probe.phases={phases!r}: must be a non-empty list of "
                        "{start, distances, gap} (the training schedule)")
    checked = tuple(_checked(Phase, phase, f"probe.phases[{i}]") for i, phase in enumerate(phases))
    starts = [phase.start for phase in checked]
    if starts[0] != 0 or any(a >= b for a, b in zip(starts, starts[1:])):
        raise UserError(f"invalid probe.phases starts {starts}: the first must be 0 and each later one larger")
    return checked


@dataclass(frozen=True)
class ProbeSettings:
    """What conf/probe/recall.yaml sets: the keys, the training phases and the validation pairs."""

    keys: int
    phases: tuple[Phase, ...]
    validation: ValidationPairs

    @classmethod
    def from_config(cls, probe_cfg) -> ProbeSettings | None:
        """The settings of a `probe` config group, checked; None for probe=none or no group."""
        if probe_cfg is None:
            return None
        values = OmegaConf.to_container(probe_cfg) if OmegaConf.is_config(probe_cfg) else dict(probe_cfg)
        if values.pop("name", "recall") == "none":
            return None
        check_rules(values, [KEYS_RULE], "probe.", owner="probe=recall", known=("keys", "phases", "validation"))
        return cls(values["keys"], _checked_phases(values.get("phases")),
                   _checked(ValidationPairs, values.get("validation"), "probe.validation"))


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
    """The markers ⟪ ⟫ and `keys` keys from Ⓐ..Ⓩ ⓐ..ⓩ; one that `text` holds is replaced by a private-use one."""
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

    ids: Tensor  # (N + 4P,) the split's N tokens in order with each pair's 4 inserted; cut: (N,)
    first_key: Tensor  # (P,) the position in ids of each pair's first key
    recall: Tensor  # (P,) the position of its recalled (second) key: first_key + distances + 2
    distances: Tensor  # (P,) d of each pair
    keys: Tensor  # (P,) the key's token id: ids[first_key] == ids[recall] == keys


def planting_generator(seed: int, split: str, planting: int, phase: int = 0) -> torch.Generator:
    """The generator of a planting of a split in a phase (phase 0 seeded as the probe before the phases)."""
    name = f"{seed}/{split}/{planting}" + (f"/{phase}" if phase else "")
    digest = hashlib.sha256(name.encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def plant(ids: Tensor, pairs: Pairs, symbols: SymbolIds, generator: torch.Generator, cut: bool = False) -> Planting:
    """Pairs inserted in `ids` (on CPU, vectorised): N + 4P tokens; cut=True: N, a pair that would not end inside
    not planted."""
    ids, n = ids.cpu(), ids.numel()
    distances = torch.tensor(pairs.distances)
    taken = 4 if cut else 0  # of the n tokens, what a pair's markers and keys take besides its text
    # No pair takes fewer than gap + min(d) + taken of them: this many pairs always fill the split.
    m = n // (pairs.gap + int(distances.min()) + taken) + 1
    cycles = -(-m // len(distances))
    order = torch.rand(cycles, len(distances), generator=generator).argsort(dim=1)  # a shuffle per cycle
    d = distances[order.flatten()[:m]]
    gaps = torch.randint(pairs.gap, 2 * pairs.gap + 1, (m,), generator=generator)
    keys = symbols.keys[torch.randint(len(symbols.keys), (m,), generator=generator)]
    ends = torch.cumsum(gaps + d + 4, 0)  # just past each pair, in the planted split
    kept = int((ends - (4 - taken) * torch.arange(1, m + 1) <= n).sum())  # increasing: the pairs that fit, a prefix
    d, keys = d[:kept], keys[:kept]
    first_key = ends[:kept] - d - 3
    recall = first_key + d + 2
    length = n if cut else n + 4 * kept
    planted = torch.empty(length, dtype=ids.dtype)
    inserted = torch.zeros(length, dtype=torch.bool)
    for positions, values in ((first_key - 1, symbols.opening), (first_key, keys),
                              (recall - 1, symbols.closing), (recall, keys)):
        planted[positions] = values
        inserted[positions] = True
    text = ~inserted
    planted[text] = ids[: length - 4 * kept]  # the text, in order, around the inserted tokens (all of it uncut)
    return Planting(planted, first_key, recall, d, keys)


class PlantedSplit:
    """The training split planted afresh at every pass and phase switch: called with a pass and the reader's step,
    the ids of that pass in the phase in force then (from step round(start x steps); `steps` set by the trainer)."""

    def __init__(self, ids: Tensor, phases: Sequence[Phase], symbols: SymbolIds, seed: int):
        self.ids, self.phases, self.symbols, self.seed = ids.cpu(), tuple(phases), symbols, seed
        self.steps = 1
        self._last: tuple[tuple[int, int], Planting] | None = None

    def phase_at(self, step: int) -> int:
        return max(i for i, phase in enumerate(self.phases) if round(phase.start * self.steps) <= step)

    def planting(self, pass_index: int, step: int = 0) -> Planting:
        key = (pass_index, self.phase_at(step))
        if self._last is None or self._last[0] != key:
            generator = planting_generator(self.seed, "train", *key)
            self._last = (key, plant(self.ids, self.phases[key[1]], self.symbols, generator))
        return self._last[1]

    def __call__(self, pass_index: int, step: int = 0) -> Tensor:
        return self.planting(pass_index, step).ids


def targets_per_distance(plantings: list[Planting], distances: Sequence[int]) -> list[int]:
    d = torch.cat([p.distances for p in plantings]) if plantings else torch.zeros(0, dtype=torch.long)
    return [int((d == distance).sum()) for distance in distances]


def fitting_pairs(pairs: ValidationPairs, tokens: int) -> tuple[ValidationPairs, list[int]]:
    """The validation pairs whose distances fit `tokens` (2 gap + d + 4 each) and those left out; none: UserError."""
    fits = [d for d in pairs.distances if 2 * pairs.gap + d + 4 <= tokens]
    if not fits:
        raise UserError(f"probe=recall: the validation split has {tokens} tokens, too few for one pair at distance "
                        f"{min(pairs.distances)} (2 x probe.validation.gap + {min(pairs.distances)} + 4); use a longer "
                        "corpus, a smaller data.train_fraction, a smaller probe.validation.gap or shorter distances")
    kept = ValidationPairs(tuple(fits), pairs.gap, pairs.min_targets)
    return kept, [d for d in pairs.distances if d not in fits]


def validation_plantings(val_ids: Tensor, pairs: ValidationPairs, symbols: SymbolIds, seed: int) -> list[Planting]:
    """Cut plantings of the validation split until every distance has pairs.min_targets recall targets."""
    plantings: list[Planting] = []
    counts = torch.zeros(len(pairs.distances), dtype=torch.long)
    distances = torch.tensor(pairs.distances)
    while int(counts.min()) < pairs.min_targets and len(plantings) < MAX_VALIDATION_PLANTINGS:
        generator = planting_generator(seed, "validation", len(plantings))
        plantings.append(plant(val_ids, pairs, symbols, generator, cut=True))
        counts += (plantings[-1].distances[:, None] == distances).sum(0)
    return plantings


def describe_validation(pairs: ValidationPairs, plantings: list[Planting], left_out: list[int]) -> list[str]:
    lines = []
    if left_out:
        lines.append(f"probe=recall: validation distances {', '.join(map(str, left_out))} left out: a pair does not "
                     f"fit the validation split ({plantings[0].ids.numel():,} tokens)")
    short = [(d, n) for d, n in zip(pairs.distances, targets_per_distance(plantings, pairs.distances))
             if n < pairs.min_targets]
    if short:
        lines.append(f"probe=recall: {MAX_VALIDATION_PLANTINGS} plantings of the validation split (the most it takes) "
                     f"give fewer than probe.validation.min_targets={pairs.min_targets} recall targets at "
                     + ", ".join(f"d = {d} ({n})" for d, n in short))
    return lines


@dataclass
class Probe:
    """A run's probe (Corpus.probe): settings, characters, the planted training split, the validation plantings."""

    settings: ProbeSettings
    symbols: ProbeSymbols
    symbol_ids: SymbolIds
    train: PlantedSplit
    validation: list[Planting]

    @classmethod
    def build(cls, settings: ProbeSettings, symbols: ProbeSymbols, tokenizer, train_ids: Tensor, val_ids: Tensor,
              seed: int) -> Probe:
        """The probe, saying what the validation split could not give; a training distance too long is refused."""
        n = train_ids.numel()
        for i, phase in enumerate(settings.phases):
            if 2 * phase.gap + max(phase.distances) > n:
                raise UserError(f"invalid probe.phases[{i}].distances: {max(phase.distances):,} does not fit the "
                                f"training split ({n:,} tokens; a pair takes 2 x probe.phases[{i}].gap + its distance "
                                f"of them), so it would never be planted; use distances up to {n - 2 * phase.gap:,}")
        ids = SymbolIds.of(symbols, tokenizer)
        pairs, left_out = fitting_pairs(settings.validation, val_ids.numel())
        validation = validation_plantings(val_ids, pairs, ids, seed)
        for line in describe_validation(pairs, validation, left_out):
            print(line)
        return cls(settings, symbols, ids, PlantedSplit(train_ids, settings.phases, ids, seed), validation)
