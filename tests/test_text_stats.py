"""The text statistics (study/text_stats.py, on the index of study/text_index.py): each against a
hand-computed example, then the reference (held-out Tiny Shakespeare), the floor (uniform random text)
and the ceiling (looped text) on the real corpus."""

from __future__ import annotations

import math

import pytest
import torch

from gru_experiments.data.corpus import split_text
from gru_experiments.study import text_stats as ts
from gru_experiments.study.text_index import KneserNeyJudge, SpanSet, TrainingIndex, words
from gru_experiments.study.text_stats import (
    STATISTICS,
    distinct_2,
    jackknife_se,
    ks_statistic,
    line_lengths,
    line_shape,
    loop_period,
    looped_text,
    reference_slices,
    seq_rep_4,
    text_statistics,
    uniform_random_text,
    value_and_se,
    word_validity,
)

PROSE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
         "First Citizen:\nYou are all resolved rather to die than to famish?\n")


# --- the real corpus: one 7-gram count for the whole file ----------------------------------------------
@pytest.fixture(scope="session")
def splits(shakespeare) -> tuple[str, str]:
    return split_text(shakespeare.read_text(encoding="utf-8"), 0.9)


@pytest.fixture(scope="session")
def index(splits) -> TrainingIndex:
    return TrainingIndex(splits[0])


@pytest.fixture(scope="session")
def reference(splits) -> list[str]:
    return reference_slices(splits[1], 20, 500, seed=0)


# --- words -------------------------------------------------------------------------------------------
def test_words_are_lower_cased_letter_runs_with_inner_apostrophes():
    assert words("O'er the hill, 'tis ne'er the end' -- Juliet’s 3rd café_x!") == \
        ["o'er", "the", "hill", "tis", "ne'er", "the", "end", "juliet’s", "rd", "café", "x"]
    assert words("Привет, мир! 東京abc") == ["привет", "мир", "東京abc"]
    assert words("a''b '' 123 ...") == ["a", "b"]
    assert words("") == []


# --- each statistic by hand ------------------------------------------------------------------------------
def test_word_validity_by_hand():
    assert word_validity("The cat sat on ZZZ.", {"the", "cat", "sat", "on"}) == pytest.approx(4 / 5)
    assert word_validity("the the qq", {"the"}) == pytest.approx(2 / 3)  # words count with repeats
    assert word_validity("123 !!", {"the"}) is None


def test_seq_rep_4_by_hand():
    # 8 words, 5 4-grams: abcd bcda cdab dabc abcd -> 4 distinct: 1 - 4/5
    assert seq_rep_4("a b c d a b c d") == pytest.approx(0.2)
    assert seq_rep_4("a b c d e") == 0.0
    assert seq_rep_4("a b c") is None


def ends_in_loop(sample: str) -> bool:
    return loop_period(sample) is not None


def test_loop_rule_by_hand():
    assert loop_period(looped_text("the son, ", 60)) == 9
    assert loop_period(looped_text("the son, ", 62)) == 9  # ends mid-phrase: still periodic
    assert loop_period("Once upon a time " + "the " * 10) == 4
    assert loop_period("x" * 40) == 1
    # a phrase of 4 repeated over exactly 32 characters is a loop, over 28 it is not
    assert ends_in_loop("xyz " + "ab c" * 8) and not ends_in_loop("xyz " + "ab c" * 7)
    # a long phrase needs three repetitions, whatever min_chars
    assert ends_in_loop("!" + "abcdefghijklmnopqrst" * 3) and not ends_in_loop("!" + "abcdefghijklmnopqrst" * 2)
    assert not ends_in_loop("Ha, ha, ha, ha!") and not ends_in_loop(PROSE) and not ends_in_loop("")
    assert ends_in_loop(looped_text("the son, ", 100))


def test_distinct_2_by_hand():
    # bigrams (a,b) (b,a) (a,b) | (a,b) (b,c): 3 distinct of 5; none across the two samples
    assert distinct_2(["a b a b", "a b c"]) == pytest.approx(3 / 5)
    assert distinct_2(["a", "b"]) is None


def test_copy_32_by_hand():
    train = "abcdefghijklmnopqrstuvwxyz0123456789"
    spans = SpanSet(train)
    sample = train[:34] + "!!"  # 5 spans: the first 3 are train's, the last 2 hold a "!"
    assert spans.found(sample).tolist() == [True, True, True, False, False]
    assert spans.share_found(sample) == pytest.approx(3 / 5)
    assert spans.share_found(train[:31]) is None
    assert SpanSet("").share_found(train) == 0.0
    assert SpanSet("abcdefgh", width=4).found("xbcdefg").tolist() == [False, True, True, True]


def test_ks_and_line_shape_by_hand():
    assert line_lengths("ab\n\ncde\n") == [2, 0, 3]
    assert line_lengths("") == [] and line_lengths("abc") == [3]
    assert ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_statistic([1, 2, 3], [4, 5]) == 1.0
    assert ks_statistic([1, 2, 3, 4], [3, 4, 5, 6]) == pytest.approx(0.5)  # at x = 2: 2/4 against 0
    assert line_shape(["ab\ncd\n"], ["xy\nzw"]) == 0.0
    assert line_shape(["ab\nc"], ["abc\nd"]) == pytest.approx(0.5)  # {2, 1} against {3, 1}
    assert line_shape([""], ["abc"]) is None
    with pytest.raises(ValueError, match="^the KS statistic needs two non-empty samples$"):
        ks_statistic([], [1, 2])


def test_reference_bpc_by_hand():
    """Order 1 on "aab" (+ the unseen symbol, V = 3): counts a 2, b 1; n1 = n2 = 1, so Y = 1/3,
    D(1) = 1/3, D(2) = 2 (D(3+) unused); gamma = (2 + 1/3)/3 = 7/9, so P(a) = 0 + 7/27,
    P(b) = (1 - 1/3)/3 + 7/27 = 13/27, P(unseen) = 7/27."""
    judge = KneserNeyJudge.counted("aab", order=1)
    assert judge.bits("ab") == pytest.approx(math.log2(27 / 13))
    expected = math.log2(27 / 13) + 2 * math.log2(27 / 7)  # b, a, and the unseen snowman
    assert judge.bits("aba☃") == pytest.approx(expected)
    assert judge.bpc("aba☃") == pytest.approx(expected / 3)
    assert judge.bpc("a") is None


def test_the_judge_scores_in_chunks_as_in_one_pass():
    text = "the quick brown fox jumps over the lazy dog, " * 5
    judge = KneserNeyJudge.counted(text, order=4)
    sample = "the lazy fox jumps over the quick dog"
    ids = judge.encode(sample).unsqueeze(0)
    log_probs, _ = judge.model(ids)
    direct = -log_probs[0, :-1].gather(1, ids[0, 1:, None]).sum().item() / math.log(2)
    assert judge.bits(sample, chunk=5) == pytest.approx(direct)
    assert judge.bits(sample) == pytest.approx(direct)


def test_standard_errors_by_hand():
    assert value_and_se([1.0, None, 3.0]) == {"value": 2.0, "se": pytest.approx(1.0)}  # sd sqrt(2), n 2
    assert value_and_se([0.5]) == {"value": 0.5, "se": None}
    assert value_and_se([None]) == {"value": None, "se": None}
    # jackknife of the mean is the usual sd / sqrt(n)
    values = [1.0, 2.0, 4.0, 7.0]
    assert jackknife_se(lambda v: sum(v) / len(v), values) == pytest.approx(value_and_se(values)["se"])


def test_helpers():
    assert looped_text("the son, ", 20) == "the son, the son, th"
    with pytest.raises(ValueError, match="^looped_text needs a non-empty phrase$"):
        looped_text("", 20)
    text = uniform_random_text("ab\n", 1000, seed=3)
    assert len(text) == 1000 and set(text) == set("ab\n") and text == uniform_random_text("ab\n", 1000, seed=3)
    val = "".join(chr(0x4E00 + i) for i in range(10_000))  # every character once: a slice's start is unique
    slices = reference_slices(val, 10, 500, seed=1)
    starts = [val.index(s) for s in slices]
    assert all(len(s) == 500 for s in slices) and starts == sorted(starts)
    assert all(b - a >= 500 for a, b in zip(starts, starts[1:]))  # stratified: no overlap
    assert reference_slices(val, 10, 500, seed=1) == slices != reference_slices(val, 10, 500, seed=2)
    crowded = reference_slices(val, 30, 500)  # 30 x 500 > 10,000: evenly spread, overlapping
    assert [val.index(s) for s in crowded][::29] == [0, 9_500]
    with pytest.raises(ValueError):
        reference_slices("short", 2, 10)


def test_text_statistics_shape_and_cache(tmp_path):
    train = PROSE * 3
    index = TrainingIndex(train, order=3)
    samples = [PROSE[:120], looped_text("speak, ", 120), PROSE[40:160]]
    stats = text_statistics(samples, index)
    assert list(stats) == list(STATISTICS)
    assert all(set(figure) == {"value", "se"} for figure in stats.values())
    assert stats["line_shape"] == {"value": None, "se": None}
    assert stats["loop_rate"]["value"] == pytest.approx(1 / 3)
    assert text_statistics(samples, index, reference=[PROSE])["line_shape"]["value"] is not None
    torch.save(index.state_dict(), tmp_path / "index.pt")
    again = TrainingIndex.from_state_dict(torch.load(tmp_path / "index.pt", weights_only=True))
    assert text_statistics(samples, again) == stats


# --- the real corpus: reference, floor and ceiling -------------------------------------------------------
def test_the_reference_reads_as_real_text(index, reference, splits):
    stats = text_statistics(reference, index, reference_slices(splits[1], 20, 500, seed=1))
    assert stats["word_validity"]["value"] > 0.9
    assert stats["copy_32"]["value"] < 0.2  # held-out text is not the training text (Tiny Shakespeare: 0)
    assert stats["loop_rate"]["value"] == 0.0
    assert stats["seq_rep_4"]["value"] < 0.05 and stats["distinct_2"]["value"] > 0.8
    assert stats["line_shape"]["value"] < 0.2
    assert stats["reference_bpc"]["value"] < 3.0
    training = reference_slices(splits[0], 10, 500, seed=0)
    assert text_statistics(training, index)["copy_32"] == {"value": 1.0, "se": 0.0}


def test_ordinary_prose_never_ends_in_a_loop(splits):
    assert not any(map(ends_in_loop, reference_slices(splits[1], 300, 500, seed=2)))


def test_floor_and_ceiling(index, reference):
    bounds = {name: text_statistics(texts, index, reference)  # as measure_text measures them
              for name, texts in ts.floor_and_ceiling_texts(index, 10, 500, seed=0).items()}
    random_stats, looped = bounds["random"], bounds["looped"]
    assert random_stats["word_validity"]["value"] < 0.1
    # under any judge, a uniform string costs at least log2 V bits a character on average (Gibbs)
    log2_v = math.log2(len(index.alphabet))
    assert log2_v < random_stats["reference_bpc"]["value"] < log2_v + 3
    assert random_stats["loop_rate"]["value"] == 0.0
    assert looped["loop_rate"]["value"] == 1.0 and looped["seq_rep_4"]["value"] > 0.9
    assert looped["line_shape"]["value"] == 1.0
    son = text_statistics([looped_text("the son, ", 500)] * 3, index)
    assert son["loop_rate"]["value"] == 1.0 and son["seq_rep_4"]["value"] > 0.9


def test_the_judge_prefers_held_out_text_and_survives_unseen_characters(index, reference):
    held_out = value_and_se(index.judge.bpc(r) for r in reference)["value"]
    noise = value_and_se(index.judge.bpc(uniform_random_text(index.alphabet, 500, seed=s)) for s in range(5))["value"]
    assert held_out < noise - 3
    strange = reference[0][:200] + "☃ü€" + reference[0][200:]
    bpc = index.judge.bpc(strange)
    assert math.isfinite(bpc) and bpc > index.judge.bpc(reference[0])
    assert 0 < text_statistics([strange], index)["reference_bpc"]["value"] < 10
