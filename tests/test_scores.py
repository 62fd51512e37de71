"""study/scores.py: paired_difference, found by sorting the two figures' kept targets, against an independent dense
pairing over the whole split (an array of its size, NaN where a figure did not score a target)."""

import math
from dataclasses import replace

import pytest
import torch

from gru_experiments.study import scores
from gru_experiments.study.scores import Score, Split, _score_nll, paired_difference


def dense_pairing(a: Score, b: Score, split: Split) -> Score:
    nll = torch.full((2, split.n_targets + 1), math.nan, dtype=torch.float64)
    nll[0, a.positions], nll[1, b.positions] = a.target_nll, b.target_nll
    both = torch.nonzero(~torch.isnan(nll).any(dim=0)).squeeze(1)
    difference = _score_nll(nll[0, both] - nll[1, both], split.ids[both], split.char_lengths)
    return difference.of(difference.tokens if a.exact and b.exact else a.population)


def test_paired_difference_is_the_dense_pairing_to_the_last_bit():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 300, (1,), generator=generator))
        split = Split(torch.randint(5, (n + 1,), generator=generator), torch.tensor([1, 1, 2, 1, 3]))

        def kept_score() -> Score:  # some targets in any order, a NaN among them now and then
            k = int(torch.randint(0, n + 1, (1,), generator=generator))
            positions = torch.randperm(n, generator=generator)[:k] + 1
            nll = torch.rand(k, generator=generator, dtype=torch.float64)
            if k and trial % 3 == 0:
                nll[0] = math.nan
            score = _score_nll(nll, split.ids[positions], split.char_lengths)
            return replace(score, positions=positions, target_nll=nll, population=n)

        a, b = kept_score(), kept_score()
        got, expected = paired_difference(a, b, split), dense_pairing(a, b, split)
        assert (got.tokens, got.characters, got.population) == (expected.tokens, expected.characters,
                                                                expected.population)
        assert got.nll_sum == expected.nll_sum and got.moments == expected.moments  # the same sums, in order
        assert got.tokens < n or trial % 3 != 0  # the NaN target is never paired


def test_a_table_scores_a_split_in_chunks_as_in_one(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(7, 7, generator=generator, dtype=torch.float64), -1)
    for n in (1, 2, 3, 50, 1000):
        split = Split(torch.randint(7, (n,), generator=generator).to(torch.uint8), torch.tensor([1, 2, 1, 1, 3, 1, 1]))
        whole = scores.score_table(log_probs, split, targets=True)
        monkeypatch.setattr(scores, "TABLE_CHUNK", 7)
        chunked = scores.score_table(log_probs, split, targets=True)
        monkeypatch.undo()
        assert torch.equal(whole.positions, chunked.positions) and torch.equal(whole.target_nll, chunked.target_nll)
        assert (whole.tokens, whole.characters) == (chunked.tokens, chunked.characters) == (n - 1, int(
            split.char_lengths[split.ids[1:].long()].sum()))
        assert chunked.nll_sum == pytest.approx(whole.nll_sum, rel=1e-12)
        assert whole.nll_sum == pytest.approx(float(-log_probs[split.ids[:-1].long(), split.ids[1:].long()].sum()))


def test_stream_rows_lay_out_the_split_as_the_whole_copy_did():
    """stream_rows builds only the rows it keeps; they equal the rows of the dense layout (the whole split copied
    into streams * length, padded at the very end), for short, empty and sampled streams and a narrow dtype."""
    from gru_experiments.data.batches import IGNORE_INDEX
    from gru_experiments.study.scores import stream_layout, stream_rows

    generator = torch.Generator().manual_seed(0)
    for n_ids, streams, stride in [(2, 1, 1), (10, 4, 1), (22, 8, 1), (22, 8, 3), (1000, 64, 5), (65, 64, 2)]:
        ids = torch.randint(0, 250, (n_ids,), generator=generator).to(torch.uint8)
        n = n_ids - 1
        s, length = stream_layout(n, streams)
        dense_inputs = torch.zeros(s * length, dtype=torch.long)
        dense_targets = torch.full((s * length,), IGNORE_INDEX, dtype=torch.long)
        dense_inputs[:n], dense_targets[:n] = ids[:-1], ids[1:]
        inputs, targets, rows, got_length = stream_rows(ids, streams, stride)
        assert got_length == length and rows.tolist() == list(range(0, s, stride))
        assert torch.equal(inputs, dense_inputs.view(s, length)[rows])
        assert torch.equal(targets, dense_targets.view(s, length)[rows])
        assert inputs.dtype == targets.dtype == torch.long


def test_a_splits_characters_are_counted_in_chunks_as_the_whole_gather_did():
    from gru_experiments.study.scores import token_counts

    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 6, (37,), generator=generator)
    for n in (0, 1, 1000, 5001):
        ids = torch.randint(37, (n,), generator=generator).int()
        split = Split(ids, lengths)
        assert split.characters == int(lengths[ids.long()].sum())
        assert torch.equal(token_counts(ids, 37, chunk=64), torch.bincount(ids.long(), minlength=37))
