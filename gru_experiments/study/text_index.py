"""What the text statistics need from a corpus's training split, counted once per corpus and cached by its sha256
(`TrainingIndex`; docs/internals.md, *The training split's index*), and the one word rule (`words`).
"""

import hashlib
import math
import re
from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import Tensor

from gru_experiments.files import atomic_file
from gru_experiments.models.ngram import NGramLM

APOSTROPHES = "'\u2019"  # ' and ’ join letters into one word
SPAN = 32  # copy_32's span, in characters
JUDGE_ORDER = 7  # reference_bpc's n-gram order
SCORE_CHUNK = 8192  # characters the judge scores at once (memory: chunk × (V + 1) float64)
# span fingerprints: a polynomial hash modulo two primes below 2^31, so that no product leaves int64
_PRIMES = (2_147_483_647, 2_147_483_629)
_BASES = (1_000_003, 1_234_567_891)


def word_matches(text: str):
    """The words of `text` as regex matches: runs of letters joined by inner apostrophes (APOSTROPHES)."""
    letters = "".join(sorted(c for c in set(text) if c.isalpha()))
    letter = f"[{re.escape(letters)}]"
    return re.finditer(f"{letter}+(?:[{APOSTROPHES}]{letter}+)*", text) if letters else iter(())


def words(text: str) -> list[str]:
    """The lower-cased words of `text`. "O'er the hill, 'tis" -> ["o'er", "the", "hill", "tis"]."""
    return [match.group().lower() for match in word_matches(text)]


def vocabulary(pieces: Iterable[str]) -> frozenset[str]:
    """The distinct `words` of the text that `pieces` make, read a piece at a time: each cut after its last line
    end (no word holds one), the rest carried to the next, so a large split never lies in memory whole."""
    found, carry = set(), ""
    for piece in pieces:
        text = carry + piece
        cut = text.rfind("\n") + 1
        found.update(match.group().lower() for match in word_matches(text[:cut]))
        carry = text[cut:]
    found.update(match.group().lower() for match in word_matches(carry))
    return frozenset(found)


def is_word_char(text: str, i: int) -> bool:
    c = text[i]
    return c.isalpha() or (c in APOSTROPHES and 0 < i < len(text) - 1 and text[i - 1].isalpha()
                           and text[i + 1].isalpha())


def word_char_mask(text: str) -> np.ndarray:
    """is_word_char at every position of `text`, in one pass of array operations (bool, len(text))."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    present = np.flatnonzero(np.bincount(codes, minlength=1))
    is_alpha = np.zeros(int(present[-1]) + 1 if len(present) else 1, dtype=bool)
    is_alpha[present] = [chr(c).isalpha() for c in present.tolist()]
    alpha = is_alpha[codes]
    word = alpha.copy()
    apostrophe = np.isin(codes, [ord(c) for c in APOSTROPHES])
    word[1:-1] |= apostrophe[1:-1] & alpha[:-2] & alpha[2:]
    return word


def span_fingerprints(text: str, width: int = SPAN) -> Tensor:
    """A fingerprint (int64) of every `width`-character span of the text, in order: two polynomial hashes
    combined (a false match about ((width − 1) / 2^31)^2 ≈ 2e-16)."""
    n = len(text) - width + 1
    if n <= 0:
        return torch.empty(0, dtype=torch.long)
    codes = torch.frombuffer(bytearray(text.encode("utf-32-le", "surrogatepass")), dtype=torch.int32).long()
    hashes = []
    for prime, base in zip(_PRIMES, _BASES):
        h = torch.zeros(n, dtype=torch.long)
        for j in range(width):
            h = (h * base + codes[j:j + n]) % prime
        hashes.append(h)
    return hashes[0] * _PRIMES[1] + hashes[1]


class SpanSet:
    """The set of every `width`-character span of a text, as sorted unique fingerprints."""

    def __init__(self, text: str = "", width: int = SPAN):
        self.width = width
        self.fingerprints = torch.unique(span_fingerprints(text, width))  # sorted

    def found(self, text: str) -> Tensor:
        """For each `width`-character span of `text` (in order), whether the set holds it."""
        queries = span_fingerprints(text, self.width)
        if not self.fingerprints.numel():
            return torch.zeros_like(queries, dtype=torch.bool)
        at = torch.searchsorted(self.fingerprints, queries).clamp(max=self.fingerprints.numel() - 1)
        return self.fingerprints[at] == queries

    def share_found(self, text: str) -> float | None:
        hits = self.found(text)
        return hits.double().mean().item() if hits.numel() else None


class KneserNeyJudge:
    """A character-level judge sharing nothing with the model that sampled the text: a Kneser-Ney NGramLM
    counted on the training split's characters, plus one "unseen" symbol for every other character
    (docs/internals.md, *The training split's index*). Built uncounted; `counted` counts one."""

    def __init__(self, alphabet: str, order: int = JUDGE_ORDER):
        self._ids = {c: i for i, c in enumerate(sorted(set(alphabet)))}
        self.unseen = len(self._ids)
        self.model = NGramLM(self.unseen + 1, order=order, smoothing="kneser_ney").eval()

    @classmethod
    def counted(cls, train_text: str, order: int = JUDGE_ORDER) -> "KneserNeyJudge":
        judge = cls(train_text, order)
        judge.model.fit(judge.encode(train_text))  # every character seen: its own id
        return judge

    def encode(self, text: str) -> Tensor:
        return torch.tensor([self._ids.get(c, self.unseen) for c in text], dtype=torch.long)

    @torch.no_grad()
    def bits(self, text: str, chunk: int = SCORE_CHUNK) -> float:
        """−log2 P of characters 2..n of `text`, scored `chunk` at a time with the context carried."""
        ids, total, state = self.encode(text), 0.0, None
        for start in range(0, len(ids) - 1, chunk):
            inputs = ids[start:min(start + chunk, len(ids) - 1)]
            targets = ids[start + 1:start + 1 + len(inputs)]
            log_probs, state = self.model(inputs.unsqueeze(0), state)
            total -= log_probs[0].gather(1, targets.unsqueeze(1)).sum().item()
        return total / math.log(2)

    def bpc(self, text: str) -> float | None:
        return self.bits(text) / (len(text) - 1) if len(text) >= 2 else None


class TrainingIndex:
    def __init__(self, train_text: str, order: int = JUDGE_ORDER, span: int = SPAN):
        counts = Counter(words(train_text))
        self.vocabulary = frozenset(counts)
        self.most_common_word = counts.most_common(1)[0][0] if counts else ""
        self.alphabet = "".join(sorted(set(train_text)))
        self.spans = SpanSet(train_text, span)
        self.judge = KneserNeyJudge.counted(train_text, order) if train_text else KneserNeyJudge("", order)

    def state_dict(self) -> dict:
        """Everything counted, as plain lists, strings and tensors (torch.load weights_only)."""
        return {"vocabulary": sorted(self.vocabulary), "most_common_word": self.most_common_word,
                "alphabet": self.alphabet, "span": self.spans.width, "fingerprints": self.spans.fingerprints,
                "order": self.judge.model.order, "judge": dict(self.judge.model.state_dict())}

    @classmethod
    def from_state_dict(cls, state: dict) -> "TrainingIndex":
        index = cls("", order=state["order"], span=state["span"])
        index.vocabulary = frozenset(state["vocabulary"])
        index.most_common_word = state["most_common_word"]
        index.alphabet = state["alphabet"]
        index.spans.fingerprints = state["fingerprints"]
        index.judge = KneserNeyJudge(index.alphabet, state["order"])  # uncounted: the counts are loaded
        index.judge.model.load_state_dict(state["judge"])
        return index

    @classmethod
    def cached(cls, train_text: str, folder, order: int = JUDGE_ORDER, span: int = SPAN) -> "TrainingIndex":
        """The index of `train_text`, loaded from `folder` when counted before (a file that does not load is
        counted again), else counted and saved there (atomically) by the split's sha256."""
        digest = hashlib.sha256(train_text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        path = Path(folder) / f"text_index_{digest}_o{order}_s{span}.pt"
        if path.is_file():
            try:
                return cls.from_state_dict(torch.load(path, weights_only=True))
            except Exception:  # unreadable: count it again below
                pass
        index = cls(train_text, order, span)
        with atomic_file(path) as f:
            torch.save(index.state_dict(), f)
        return index
