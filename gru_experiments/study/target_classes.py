"""The kinds of target: every target of a split in one of `line_start`, `word_start`, `word_inside` and `other`, by its
character and the one before it, with the overlay `long_copy` (a word last seen far back), vectorised over a split;
the rules: docs/internals.md, *The kinds of target*. The curve by kind of target: study/evaluation.curve_by_class."""

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gru_experiments.study.text_index import word_char_mask, word_matches

CLASSES = ("word_start", "word_inside", "line_start", "other")
LONG_COPY = "long_copy"
WORD_START, WORD_INSIDE, LINE_START, OTHER = range(len(CLASSES))


@dataclass(frozen=True)
class TargetClasses:
    """Per token of a split: `labels` (an index into CLASSES) and `long_copy` (the overlay)."""
    labels: Tensor
    long_copy: Tensor

    def masks(self) -> dict[str, Tensor]:
        """{class: bool mask over the split's tokens}, the four classes then the overlay."""
        return {name: self.labels == i for i, name in enumerate(CLASSES)} | {LONG_COPY: self.long_copy}


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


def classify(surfaces: list[str], window: int, longest: int | None, kept: Tensor | None = None) -> TargetClasses:
    """The classes of a split given as its tokens' texts (`surfaces`; one character each for a character
    model): a token's class is that of its first character; the overlay's distances are in tokens, and with
    `kept` (token positions) the overlay is found only around them (_stretches), as far back as it reaches."""
    starts = np.cumsum([0, *map(len, surfaces)])[:len(surfaces)]  # the character offset of each token
    return _classes("".join(surfaces), starts, window, longest, kept)


def split_classes(ids: Tensor, tokenizer, window: int, longest: int | None,
                  kept: Tensor | None = None) -> TargetClasses:
    """`classify` of a split's token ids: a lookup per id (for one-character tokens, of code points: no Python
    string per token)."""
    surfaces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    lengths, ids = np.array([len(s) for s in surfaces]), ids.cpu().numpy()
    if (lengths == 1).all():
        text = np.array([ord(s) for s in surfaces], dtype="<u4")[ids].tobytes().decode("utf-32-le", "surrogatepass")
        starts = np.arange(len(ids))
    else:
        text = "".join(np.array(surfaces, dtype=object)[ids])
        starts = np.concatenate([[0], np.cumsum(lengths[ids])[:-1]]).astype(np.int64)
    return _classes(text, starts, window, longest, kept)


def _classes(text: str, starts: np.ndarray, window: int, longest: int | None, kept: Tensor | None) -> TargetClasses:
    labels = start_classes(text, starts)
    long_copy = torch.zeros(len(starts), dtype=torch.bool)
    if not longest:
        return TargetClasses(labels, long_copy)
    for first_char, end_char in _stretches(text, starts, longest, kept):
        last_seen, matches = {}, list(word_matches(text[first_char:end_char]))
        edges = first_char + np.array([(m.start(), m.end() - 1) for m in matches], dtype=np.int64).reshape(-1, 2)
        tokens = np.searchsorted(starts, edges, side="right") - 1  # the tokens of each word's first and last
        for match, (first, last) in zip(matches, tokens.tolist()):
            word = match.group().lower()
            before = last_seen.get(word)
            if before is not None and window < first - before <= longest:
                long_copy[first:last + 1] = True
            last_seen[word] = first
    return TargetClasses(labels, long_copy)


def _stretches(text: str, starts: np.ndarray, longest: int, kept: Tensor | None) -> list[tuple[int, int]]:
    """The stretches of text (character ranges) the overlay is found in: the whole text, or around each `kept`
    token p, to the end of its word and from 2 x `longest` tokens before it, the start moved back to where no word
    runs across it twice (p's word's start, then `longest` tokens before that), merged: each kept token's overlay
    as the whole text gives it, at the cost of its stretch (a sampled plan's, not the split's)."""
    if kept is None or not len(starts):
        return [(0, len(text))]
    word = word_char_mask(text)
    boundaries = np.concatenate([[0], np.flatnonzero(~(word[:-1] & word[1:])) + 1, [len(text)]])  # no word across
    kept = np.unique(kept.cpu().numpy().clip(0, len(starts) - 1))
    to_char = np.append(starts, len(text))

    def back(tokens: np.ndarray) -> np.ndarray:  # `longest` tokens back, then back to a boundary, in characters
        chars = to_char[np.maximum(tokens - longest, 0)]
        return boundaries[np.searchsorted(boundaries, chars, side="right") - 1]

    begin = back(np.searchsorted(starts, back(kept), side="right") - 1)
    end = boundaries[np.searchsorted(boundaries, to_char[kept + 1])]  # p's word whole
    stretches = []
    for b, e in zip(begin.tolist(), end.tolist()):
        if stretches and b <= stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], e)
        else:
            stretches.append([b, e])
    return [tuple(s) for s in stretches]
