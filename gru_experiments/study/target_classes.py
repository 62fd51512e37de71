"""The kinds of target for the context curve by class: every target in one of `line_start`, `word_start`,
`word_inside` and `other`, by its character and the one before it, with the overlay `long_copy` (a word
last seen far back); the rules: docs/internals.md, *The kinds of target*.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gru_experiments.study.text_index import APOSTROPHES, word_matches

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


def is_word_char(text: str, i: int) -> bool:
    """A letter, or an apostrophe between two letters."""
    c = text[i]
    if c.isalpha():
        return True
    return c in APOSTROPHES and 0 < i < len(text) - 1 and text[i - 1].isalpha() and text[i + 1].isalpha()


def character_class(text: str, i: int) -> int:
    if i == 0 or text[i - 1] == "\n":
        return LINE_START
    if not is_word_char(text, i):
        return OTHER
    return WORD_INSIDE if is_word_char(text, i - 1) else WORD_START


def classify(surfaces: list[str], window: int, longest: int | None) -> TargetClasses:
    """The classes of a split given as its tokens' texts (`surfaces`; one character each for a character
    model): a token's class is that of its first character; the overlay's distances are in tokens."""
    text = "".join(surfaces)
    starts, offset = [], 0
    for surface in surfaces:  # the character offset of each token
        starts.append(offset)
        offset += len(surface)
    token_at = torch.zeros(len(text) + 1, dtype=torch.long)  # the token of each character
    token_at[torch.tensor(starts[1:], dtype=torch.long)] = 1
    token_at = torch.cumsum(token_at, 0)
    labels = torch.tensor([character_class(text, s) if s < len(text) else OTHER for s in starts], dtype=torch.long)
    long_copy, last_seen = torch.zeros(len(surfaces), dtype=torch.bool), {}
    if longest:
        for match in word_matches(text):
            word, first = match.group().lower(), int(token_at[match.start()])
            before = last_seen.get(word)
            if before is not None and window < first - before <= longest:
                long_copy[first:int(token_at[match.end() - 1]) + 1] = True
            last_seen[word] = first
    return TargetClasses(labels, long_copy)


def split_classes(ids: Tensor, tokenizer, window: int, longest: int | None) -> TargetClasses:
    """`classify` of a split's token ids (decoding is a lookup per id for both tokenizers)."""
    surfaces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    return classify([surfaces[i] for i in ids.tolist()], window, longest)
