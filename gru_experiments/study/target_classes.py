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


def classify(surfaces: list[str], window: int, longest: int | None) -> TargetClasses:
    """The classes of a split given as its tokens' texts (`surfaces`; one character each for a character
    model): a token's class is that of its first character; the overlay's distances are in tokens."""
    text = "".join(surfaces)
    starts = np.cumsum([0, *map(len, surfaces)])[:len(surfaces)]  # the character offset of each token
    token_at = torch.zeros(len(text) + 1, dtype=torch.long)  # the token of each character
    token_at[torch.from_numpy(starts[1:]).long()] = 1
    token_at = torch.cumsum(token_at, 0)
    labels = start_classes(text, starts)
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
    surfaces = np.array([tokenizer.decode([i]) for i in range(tokenizer.vocab_size)], dtype=object)
    return classify(list(surfaces[ids.cpu().numpy()]), window, longest)
