"""The kinds of target: every target of a split in one of `line_start`, `word_start`, `word_inside` and `other`, by its
character and the one before it, with the overlay `long_copy` (a word last seen far back), vectorised over a split;
the rules: docs/internals.md, *The kinds of target*. The curve by kind of target: study/evaluation.curve_by_class."""

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from gru_experiments.study.text_index import word_char_mask, word_matches

CLASSES = ("word_start", "word_inside", "line_start", "other")
LONG_COPY = "long_copy"
WORD_START, WORD_INSIDE, LINE_START, OTHER = range(len(CLASSES))
UNCLASSED = -1  # a token outside a sampled plan's stretches (split_classes): in no class


@dataclass(frozen=True)
class TargetClasses:
    """Per token of a split: `labels` (an index into CLASSES) and `long_copy` (the overlay)."""
    labels: Tensor
    long_copy: Tensor

    def masks(self) -> Iterator[tuple[str, Tensor]]:
        """(class, bool mask over the split's tokens), the four classes then the overlay, one at a time (a long
        split's masks never all at once)."""
        for i, name in enumerate(CLASSES):
            yield name, self.labels == i
        yield LONG_COPY, self.long_copy


def start_classes(text: str, starts: np.ndarray) -> Tensor:
    """The class of the character at each of `starts` (OTHER past the text's end), vectorised: a line's first
    character, else not a word character, else a word's inside or its start (text_index.is_word_char)."""
    word = word_char_mask(text)
    labels = np.full(len(starts), OTHER)
    at = starts[starts < len(text)]
    before = np.maximum(at - 1, 0)  # position 0 is a line start whatever comes "before" it
    line_start = (at == 0) | (np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")[before] == 10)
    labels[starts < len(text)] = np.where(line_start, LINE_START, np.where(
        ~word[at], OTHER, np.where(word[before], WORD_INSIDE, WORD_START)))
    return torch.from_numpy(labels).long()


def classify(surfaces: list[str], window: int, longest: int | None) -> TargetClasses:
    """The classes of a split given as its tokens' texts (`surfaces`; one character each for a character
    model): a token's class is that of its first character; the overlay's distances are in tokens."""
    starts = np.cumsum([0, *map(len, surfaces)])[:len(surfaces)]  # the character offset of each token
    return _classes("".join(surfaces), starts, window, longest)


def split_classes(ids: Tensor, tokenizer, window: int, longest: int | None,
                  kept: Tensor | None = None) -> TargetClasses:
    """`classify` of a split's token ids. With `kept` (token positions), only the stretches of the split around
    them (_stretches): each kept token's class and overlay as the whole split gives them, at the cost of its
    stretch (a sampled plan's, not the split's); every other token in no class (UNCLASSED)."""
    text_of, ids = _Decoder(tokenizer), ids.cpu().numpy()
    if kept is None:
        return _classes(*text_of(ids), window, longest)
    labels = torch.full((len(ids),), UNCLASSED, dtype=torch.int8)
    long_copy = torch.zeros(len(ids), dtype=torch.bool)
    for lo, hi in _stretches(ids, text_of, longest or 0, kept.cpu().numpy()):
        head = max(lo - 2, 0)  # two tokens before: what the first one's class reads of the character before it
        labels[lo:hi] = start_classes(*text_of(ids[head:hi]))[lo - head:].to(torch.int8)
        if longest:
            long_copy[lo:hi] = _classes(*text_of(ids[lo:hi]), window, longest).long_copy
    return TargetClasses(labels, long_copy)


class _Decoder:
    """A run of token ids as (its text, each token's first character's offset): a lookup per id (for one-character
    tokens, of code points: no Python string per token)."""

    def __init__(self, tokenizer):
        surfaces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
        self.lengths = np.array([len(s) for s in surfaces])
        self.single = bool((self.lengths == 1).all())
        self.table = (np.array([ord(s) for s in surfaces], dtype="<u4") if self.single
                      else np.array(surfaces, dtype=object))

    def __call__(self, ids: np.ndarray) -> tuple[str, np.ndarray]:
        if self.single:
            return self.table[ids].tobytes().decode("utf-32-le", "surrogatepass"), np.arange(len(ids))
        return "".join(self.table[ids]), np.concatenate([[0], np.cumsum(self.lengths[ids])[:-1]]).astype(np.int64)


def _classes(text: str, starts: np.ndarray, window: int, longest: int | None) -> TargetClasses:
    labels = start_classes(text, starts)
    long_copy, last_seen = torch.zeros(len(starts), dtype=torch.bool), {}
    if longest:
        matches = list(word_matches(text))
        edges = np.array([(m.start(), m.end() - 1) for m in matches], dtype=np.int64).reshape(-1, 2)
        tokens = np.searchsorted(starts, edges, side="right") - 1  # the tokens of each word's first and last
        for match, (first, last) in zip(matches, tokens.tolist()):
            word = match.group().lower()
            before = last_seen.get(word)
            if before is not None and window < first - before <= longest:
                long_copy[first:last + 1] = True
            last_seen[word] = first
    return TargetClasses(labels, long_copy)


def _stretches(ids: np.ndarray, text_of: _Decoder, longest: int, kept: np.ndarray) -> list[tuple[int, int]]:
    """Token ranges around the `kept` tokens: each run of them (gaps of at most 2 x longest), from 2 x `longest`
    tokens before its first, moved back to a token start no word runs across twice (its first's word's start,
    then `longest` tokens before that: every word the overlay compares it with, whole), to the end of its last's
    word; merged where they meet."""
    kept = np.unique(kept.clip(0, len(ids) - 1))
    if not len(kept):
        return []
    cuts = np.flatnonzero(np.diff(kept) > 2 * longest + 1)
    stretches = []
    for a, b in zip(kept[np.r_[0, cuts + 1]].tolist(), kept[np.r_[cuts, len(kept) - 1]].tolist()):
        lo = _boundary(ids, text_of, _boundary(ids, text_of, a - longest, -1) - longest, -1)
        hi = _boundary(ids, text_of, b + 1, +1)
        if stretches and lo <= stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], hi)
        else:
            stretches.append([lo, hi])
    return [tuple(s) for s in stretches]


def _boundary(ids: np.ndarray, text_of: _Decoder, token: int, direction: int) -> int:
    """The nearest token start at or before (direction -1) or after (+1) `token` that no word runs across (the
    split's ends included), read from the text around it (a wider stretch while none is found)."""
    token, span = min(max(token, 0), len(ids)), 64
    if token in (0, len(ids)):
        return token
    while True:
        lo, hi = (max(token - span, 0), token + 1) if direction < 0 else (token, min(token + span, len(ids)))
        # two tokens either side: an apostrophe is a word's by the characters beside it
        text, starts = text_of(ids[max(lo - 2, 0):min(hi + 2, len(ids))])
        word, shift = word_char_mask(text), min(lo, 2)
        at = starts[shift:shift + hi - lo]  # the candidates' first characters
        free = (at == 0) | (at >= len(text)) | ~(word[np.maximum(at - 1, 0)] & word[np.minimum(at, len(text) - 1)])
        free |= (np.arange(lo, hi) == 0) | (np.arange(lo, hi) >= len(ids))
        found = np.flatnonzero(free)
        if len(found):
            return lo + int(found[-1] if direction < 0 else found[0])
        if (direction < 0 and lo == 0) or (direction > 0 and hi >= len(ids)):
            return 0 if direction < 0 else len(ids)
        span *= 2
