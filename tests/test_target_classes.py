"""study/target_classes.py: the long-copy overlay found only around the kept targets (a sampled plan's) equals the
whole split's at every kept target, and the classes' labels are the whole split's."""

import random

import pytest
import torch

from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.study.target_classes import UNCLASSED, _Decoder, _stretches, classify, split_classes


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
