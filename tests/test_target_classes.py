"""The kinds of target (study/target_classes.py) against a hand-labelled string, a subword token's class, and the
curve by class on a real evaluation: every target counted once, a class without targets without figures; and a
sampled plan's classes, found only around its kept targets, as the whole split gives them."""

from __future__ import annotations

import math
import random

import pytest
import torch
from evaluation_helpers import run_plan

from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.plan import plan_evaluation
from gru_experiments.study.scores import Split
from gru_experiments.study.target_classes import (
    CLASSES,
    LONG_COPY,
    UNCLASSED,
    _Decoder,
    _stretches,
    classify,
    split_classes,
)

HAND = "KING:\nO'er the hill, 'tis the hill.\n\nNo"


#       K    I   N    G    :    \n   O    '    e    r    ␣    t    h    e   ␣
HAND_LABELS = ["line_start", "word_inside", "word_inside", "word_inside", "other", "other",
               "line_start", "word_inside", "word_inside", "word_inside", "other",
               "word_start", "word_inside", "word_inside", "other",
               "word_start", "word_inside", "word_inside", "word_inside", "other", "other",  # hill,␣
               "other", "word_start", "word_inside", "word_inside", "other",  # 'tis␣
               "word_start", "word_inside", "word_inside", "other",  # the␣
               "word_start", "word_inside", "word_inside", "word_inside", "other", "other",  # hill.\n
               "line_start", "line_start", "word_inside"]  # \n (an empty line's first), N, o


def test_the_classes_match_a_hand_labelled_string():
    assert len(HAND_LABELS) == len(HAND)
    classes = classify(list(HAND), window=5, longest=20)
    assert [CLASSES[i] for i in classes.labels.tolist()] == HAND_LABELS
    # "the" (at 11) recurs at 26: 15 back, past the window of 5 and within 20: long-range copy;
    # "hill" (at 15) recurs at 30: 15 back, too; nothing else recurs
    flagged = [i for i, on in enumerate(classes.long_copy.tolist()) if on]
    assert flagged == [26, 27, 28, 30, 31, 32, 33]
    assert classify(list(HAND), window=15, longest=20).long_copy.sum() == 0  # 15 back is not past 15
    assert classify(list(HAND), window=5, longest=14).long_copy.sum() == 0  # nor within 14


def test_subword_tokens_take_the_class_of_their_first_character():
    classes = classify(["KI", "NG", ":\n", "O'er", " the", "\n", "No"], window=1, longest=None)
    assert [CLASSES[i] for i in classes.labels.tolist()] == ["line_start", "word_inside", "other", "line_start",
                                                              "other", "other", "line_start"]


def test_the_curve_by_class_counts_every_target_once(small_text="to be or not to be, that is the question\n" * 40):
    tokenizer = CharTokenizer.from_text(small_text)
    split = Split.of(torch.tensor(tokenizer.encode(small_text)), tokenizer)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=4, hidden_size=8, num_layers=1)
    plan = plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=None, curve_longest=64)
    classes = split_classes(split.ids, tokenizer, 16, 64)
    evaluation = run_plan(model, split.ids, split, plan, classes=classes)
    by_class = evaluation.curve["by_class"]
    assert sum(by_class[name]["targets"] for name in CLASSES) == split.n_targets
    assert 0 < by_class[LONG_COPY]["targets"] < split.n_targets
    # the classes' figures, weighted by their characters, give back the whole curve's (one char per target)
    for key in ("1", "16", "32", "64"):
        whole = sum(by_class[name]["curve"][key] * by_class[name]["targets"] for name in CLASSES if
                    by_class[name]["targets"]) / split.n_targets
        assert whole == pytest.approx(evaluation.curve[key], rel=1e-9, abs=1e-6)
    for name in CLASSES:
        gain = by_class[name]["state_gain"]
        assert gain["targets"] <= by_class[name]["targets"] and math.isfinite(gain["bpc"])


def test_a_class_without_targets_has_no_figures(text="to be or not to be, that is the question; " * 40):
    """A text of one line: no target starts a line, so line_start's curve is None up to seq_len and has no point
    past it (that point builds on the seq_len one), where the other classes have every point."""
    tokenizer = CharTokenizer.from_text(text)
    split = Split.of(torch.tensor(tokenizer.encode(text)), tokenizer)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=4, hidden_size=8, num_layers=1)
    plan = plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=None, curve_longest=64)
    by_class = run_plan(model, split.ids, split, plan, classes=split_classes(split.ids, tokenizer, 16, 64)).curve[
        "by_class"]
    empty = by_class["line_start"]
    assert empty["targets"] == 0 and empty["state_gain"] == {"bpc": None, "se": None, "targets": 0}
    assert set(empty["curve"]) == {"1", "2", "4", "8", "16", "stateful"} and set(empty["curve"].values()) == {None}
    assert {"32", "64"} <= set(by_class["word_inside"]["curve"]) and by_class["word_inside"]["curve"]["64"] > 0


@pytest.mark.parametrize("window, longest", [(5, 40), (1, 3), (2, 9), (1, 2)])
def test_the_overlay_around_kept_targets_is_the_whole_split_s(window, longest):
    rng = random.Random(window * 100 + longest)
    words = ["the", "hill", "o'er", "a", "tis", "question", "be", "not", "Romeo", "ROMEO", "x" * 12]
    text = "".join(rng.choice(words) + rng.choice([" ", ", ", "\n", ". ", "'", "'"]) for _ in range(1500))
    tokenizer = CharTokenizer.from_text(text)
    ids = torch.tensor(tokenizer.encode(text))
    whole = split_classes(ids, tokenizer, window, longest)
    assert torch.equal(classify(list(text), window, longest).long_copy, whole.long_copy)  # the two doors agree
    assert 0 < int(whole.long_copy.sum()) < len(ids)
    for _ in range(20):
        kept = torch.tensor(sorted(rng.sample(range(len(ids)), rng.randint(1, 40))))
        part = split_classes(ids, tokenizer, window, longest, kept)
        assert torch.equal(part.labels[kept].long(), whole.labels[kept])
        assert torch.equal(part.long_copy[kept], whole.long_copy[kept])
        outside = torch.ones(len(ids), dtype=torch.bool)
        for lo, hi in _stretches(ids.numpy(), _Decoder(tokenizer), longest, kept.numpy()):
            outside[lo:hi] = False
        assert bool(outside.any()) and bool((part.labels[outside] == UNCLASSED).all())  # the rest: no class
