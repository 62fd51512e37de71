"""Text statistics: the generated text measured, model-free, beside held-out text (`reference_slices`)
and random and looped text (`floor_and_ceiling_texts`). Definitions, reference values and why each error
estimate: docs/internals.md, *The text statistics*; the training split's side: text_index.py.
"""

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet

from gru_experiments.study.text_index import TrainingIndex, words

STATISTICS = ("word_validity", "seq_rep_4", "loop_rate", "distinct_2", "copy_32", "line_shape", "reference_bpc")
LOOP_REPEATS = 3  # loop_rate: a phrase repeated at least this many times ...
LOOP_MIN_CHARS = 32  # ... over at least this many characters at the end of the sample
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 0


def ngrams(items: Sequence, n: int) -> list[tuple]:
    return [tuple(items[i:i + n]) for i in range(len(items) - n + 1)]


# --- per-sample statistics -----------------------------------------------------------------------
def word_validity(sample: str, vocabulary: AbstractSet[str]) -> float | None:
    """The share of the sample's words (with repeats) in the training split's `vocabulary`; None: no word."""
    sample_words = words(sample)
    return sum(w in vocabulary for w in sample_words) / len(sample_words) if sample_words else None


def seq_rep_4(sample: str) -> float | None:
    """Welleck et al. 2020's seq-rep-4 within one sample: 1 − distinct word 4-grams / word 4-grams.
    0 for text that never repeats a 4-gram, near 1 for a loop; None for fewer than four words."""
    grams = ngrams(words(sample), 4)
    return 1 - len(set(grams)) / len(grams) if grams else None


def loop_period(sample: str, repeats: int = LOOP_REPEATS, min_chars: int = LOOP_MIN_CHARS) -> int | None:
    """The shortest period p of a loop the sample ends in (its last m >= max(repeats · p, min_chars)
    characters periodic), or None: docs/internals.md, *The text statistics*."""
    n = len(sample)
    for p in range(1, n // repeats + 1):
        i = n - 1
        while i >= p and sample[i] == sample[i - p]:
            i -= 1
        periodic = min(n, n - 1 - i + p)  # the periodic tail: the phrase, then every character matching
        if periodic >= max(repeats * p, min_chars):
            return p
    return None


# --- per-setting statistics (loop_rate: the share of samples with a loop_period, text_statistics) -------------
def distinct_2(samples: Sequence[str]) -> float | None:
    """Distinct word bigrams / word bigrams, none across samples; None without a bigram."""
    grams = [g for sample in samples for g in ngrams(words(sample), 2)]
    return len(set(grams)) / len(grams) if grams else None


def line_lengths(text: str) -> list[int]:
    """The lengths of the text's lines, the pieces cut by its ends included. "ab\\n\\ncde\\n" -> [2, 0, 3]."""
    return [len(piece) for piece in text.removesuffix("\n").split("\n")] if text else []


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov–Smirnov statistic sup_x |F_a(x) − F_b(x)|."""
    if not a or not b:
        raise ValueError("the KS statistic needs two non-empty samples")
    a, b = sorted(a), sorted(b)
    return max(abs(bisect_right(a, x) / len(a) - bisect_right(b, x) / len(b)) for x in set(a) | set(b))


def line_shape(samples: Sequence[str], reference: Sequence[str]) -> float | None:
    """The KS statistic between the samples' and the reference's line lengths; None: either has no line."""
    return _line_shape([line_lengths(s) for s in samples], [line_lengths(r) for r in reference])


def _line_shape(sample_lines: Sequence[list[int]], reference_lines: Sequence[list[int]]) -> float | None:
    a = [n for lines in sample_lines for n in lines]
    b = [n for lines in reference_lines for n in lines]
    return ks_statistic(a, b) if a and b else None


# --- a setting's figures, with standard errors -------------------------------------------------------
def standard_deviation(values: Sequence[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def value_and_se(values: Iterable[float | None]) -> dict:
    defined = [v for v in values if v is not None]
    if not defined:
        return {"value": None, "se": None}
    sd = standard_deviation(defined)
    return {"value": sum(defined) / len(defined), "se": None if sd is None else sd / math.sqrt(len(defined))}


def jackknife_se(statistic: Callable[[list], float | None], items: Sequence) -> float | None:
    """The leave-one-out jackknife standard error of statistic(items); None with fewer than two."""
    leave_one_out = [statistic(list(items[:i]) + list(items[i + 1:])) for i in range(len(items))]
    thetas = [t for t in leave_one_out if t is not None]
    n = len(thetas)
    if n < 2:
        return None
    mean = sum(thetas) / n
    return math.sqrt((n - 1) / n * sum((t - mean) ** 2 for t in thetas))


def line_shape_se(samples: Sequence[str], reference: Sequence[str]) -> float | None:
    """The bootstrap standard error of line_shape over BOOTSTRAP_RESAMPLES seeded resamplings of the samples
    and, independently, of the reference. None with fewer than two of either."""
    if len(samples) < 2 or len(reference) < 2:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    sample_lines, reference_lines = [line_lengths(s) for s in samples], [line_lengths(r) for r in reference]
    values = [_line_shape(rng.choices(sample_lines, k=len(samples)), rng.choices(reference_lines, k=len(reference)))
              for _ in range(BOOTSTRAP_RESAMPLES)]
    return standard_deviation([v for v in values if v is not None])


def text_statistics(samples: Sequence[str], index: TrainingIndex, reference: Sequence[str] | None = None) -> dict:
    """{name: {"value", "se"}} for the names in STATISTICS; line_shape against `reference` (None: none)."""
    samples = list(samples)
    return {
        "word_validity": value_and_se(word_validity(s, index.vocabulary) for s in samples),
        "seq_rep_4": value_and_se(seq_rep_4(s) for s in samples),
        "loop_rate": value_and_se(float(loop_period(s) is not None) for s in samples),
        "distinct_2": {"value": distinct_2(samples), "se": jackknife_se(distinct_2, samples)},
        "copy_32": value_and_se(index.spans.share_found(s) for s in samples),  # its 32-character spans found
        "line_shape": {"value": None, "se": None} if reference is None else
                      {"value": line_shape(samples, reference), "se": line_shape_se(samples, reference)},
        "reference_bpc": value_and_se(index.judge.bpc(s) for s in samples),  # under the judge (KneserNeyJudge)
    }


# --- reference, floor and ceiling -------------------------------------------------------------------
def reference_slices(val_text: str, n: int, length: int, seed: int = 0) -> list[str]:
    """n slices of `length` characters of the validation text, in order: each at a seeded random place in
    its own n-th of the text when they fit (no overlap), else spread evenly (neighbours overlap)."""
    room = len(val_text) - length
    if n < 1 or length < 1 or room < 0:
        raise ValueError(f"cannot cut {n} slices of {length} characters from a text of {len(val_text)}")
    stretch = len(val_text) // n
    if stretch >= length:
        rng = random.Random(seed)
        starts = [k * stretch + rng.randint(0, stretch - length) for k in range(n)]
    else:
        starts = [round(k * room / max(n - 1, 1)) for k in range(n)]
    return [val_text[start:start + length] for start in starts]


def uniform_random_text(alphabet: Iterable[str], length: int, seed: int = 0) -> str:
    """`length` characters drawn uniformly from `alphabet` (seeded): the floor of every statistic."""
    chars = sorted(set(alphabet))
    return "".join(random.Random(seed).choices(chars, k=length))


def looped_text(phrase: str, length: int) -> str:
    """`phrase` repeated to `length` characters: the ceiling. looped_text("ab ", 5) == "ab ab"."""
    if not phrase:
        raise ValueError("looped_text needs a non-empty phrase")
    return (phrase * (length // len(phrase) + 1))[:length]


def floor_and_ceiling_texts(index: TrainingIndex, n: int, length: int, seed: int = 0) -> dict[str, list[str]]:
    """{"random": n random texts (seeds seed..seed+n−1), "looped": n copies of the most common training word
    and a space looped}, each of `length` characters."""
    phrase = f"{index.most_common_word or index.alphabet[:1]} "
    return {"random": [uniform_random_text(index.alphabet, length, seed + i) for i in range(n)],
            "looped": [looped_text(phrase, length)] * n}
