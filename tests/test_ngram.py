"""The n-gram family: its Kneser-Ney probabilities against an independent, loop-and-dict
implementation, normalisation in every context, the add-one bigram baseline, state and checkpoints."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from gru_experiments.errors import UserError
from gru_experiments.models.ngram import MIN_DISCOUNT, SMOOTHINGS, NGramLM
from gru_experiments.models.protocol import NO_TOKEN, InvalidSetting
from gru_experiments.study.scores import Split, score_bigram


def corpus(n=3000, V=9, seed=0) -> list[int]:
    """A text-like token stream over tokens 0..V-3 (the last two tokens never occur)."""
    rng = random.Random(seed)
    words = [[rng.randrange(V - 2) for _ in range(rng.randint(1, 4))] for _ in range(25)]
    out = []
    while len(out) < n:
        out += rng.choice(words) + [0]
    return out[:n]


class NaiveKneserNey:
    """Interpolated modified Kneser-Ney written out with Counters and recursion, straight from
    Chen & Goodman: raw counts at the highest order, continuation counts below it."""

    def __init__(self, tokens: list[int], V: int, N: int):
        self.V, self.N = V, N
        grams = {k: Counter(tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1)) for k in range(1, N + 1)}
        self.counts = {N: grams[N]}
        for k in range(1, N):
            continuation = Counter()
            for gram in grams[k + 1]:
                continuation[gram[1:]] += 1
            self.counts[k] = continuation
        self.discounts = {}
        for k, counts in self.counts.items():
            n = [sum(1 for c in counts.values() if c == r) for r in range(1, 5)]
            y = n[0] / (n[0] + 2 * n[1]) if n[0] + n[1] else 0.5  # no count of 1 or 2: the variant's 1/2
            d = [0.0] + [r - (r + 1) * y * n[r] / n[r - 1] if n[r - 1] else r / 2 for r in (1, 2, 3)]
            self.discounts[k] = [0.0] + [min(max(d[r], MIN_DISCOUNT), r) for r in (1, 2, 3)]

    def prob(self, history: tuple, w: int, k: int | None = None) -> float:
        if k is None:
            k = min(len(history), self.N - 1) + 1
            history = history[len(history) - (k - 1):] if k > 1 else ()
        if k == 0:
            return 1 / self.V
        counts, D = self.counts[k], self.discounts[k]
        row = [counts.get(history + (x,), 0) for x in range(self.V)]
        total = sum(row)
        lower = self.prob(history[1:], w, k - 1)
        if total == 0:
            return lower
        discount = lambda c: min(D[min(c, 3)], c)  # noqa: E731
        gamma = sum(discount(c) for c in row) / total
        return max(row[w] - discount(row[w]), 0) / total + gamma * lower


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_kneser_ney_matches_independent_implementation(order):
    V = 9
    tokens = corpus(V=V)
    model = NGramLM(V, order).double().fit(torch.tensor(tokens))
    naive = NaiveKneserNey(tokens, V, order)
    rng = random.Random(1)
    # seen contexts, contexts with unseen tokens (V-1, V-2), and histories shorter than N-1
    width = max(order - 1, 1)
    histories = [tuple(tokens[i:i + width]) for i in range(0, 60, 7)]
    histories += [tuple(rng.randrange(V) for _ in range(width)) for _ in range(8)]
    histories += [tuple(tokens[:j]) for j in range(1, order)]
    for history in histories:  # the tokens before the prediction: the last one fed, the others as state
        state = torch.full((1, order - 1), NO_TOKEN)
        before = history[:-1][-(order - 1):] if order > 1 else ()
        if before:
            state[0, order - 1 - len(before):] = torch.tensor(before)
        logits, _ = model(torch.tensor([[history[-1]]]), state)
        expected = torch.tensor([naive.prob(history, w) for w in range(V)], dtype=torch.float64)
        torch.testing.assert_close(logits[0, -1].double().exp(), expected, atol=1e-6, rtol=1e-5)


def test_probabilities_sum_to_one_in_every_context_seen_and_unseen():
    V, order = 12, 4
    tokens = corpus(V=V)
    model = NGramLM(V, order).fit(torch.tensor(tokens))
    contexts = torch.randint(0, V, (500, 10))  # random: most 3-token contexts were never seen
    contexts[:100] = torch.tensor(tokens[:1000]).view(100, 10)  # seen ones
    contexts[100:120, -1] = V - 1  # a token absent from the training split
    for state in (None, torch.full((500, order - 1), NO_TOKEN), contexts[:, :order - 1]):
        logits, _ = model(contexts, state)
        sums = logits.double().exp().sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
        assert torch.isfinite(logits).all()
    for smoothing in ("add_one",):
        logits, _ = NGramLM(V, order, smoothing).fit(torch.tensor(tokens))(contexts)
        torch.testing.assert_close(logits.double().exp().sum(-1), torch.ones(500, 10, dtype=torch.float64),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("smoothing, order", [("add_one", 2), ("add_one", 3), ("kneser_ney", 1),
                                             ("kneser_ney", 2), ("kneser_ney", 4)])
def test_a_token_never_seen_in_training_gets_probability_above_zero(smoothing, order):
    """A char vocabulary is the whole corpus's characters, so a character of the validation split alone
    is a token the counts never saw: it must get probability > 0 after any context (seen contexts, and
    contexts made of unseen tokens), every distribution summing to 1, so its cost is finite."""
    V = 9  # tokens V-2 and V-1 never occur in the training stream
    tokens = corpus(V=V)
    model = NGramLM(V, order, smoothing).fit(torch.tensor(tokens))
    seen = torch.tensor(tokens[:400]).view(40, 10)
    unseen = torch.tensor([[V - 1, V - 2] * 5, [0, 1, 2, 3, 4, V - 1, V - 1, V - 2, V - 1, 5]])
    for contexts in (seen, unseen):
        probs = model(contexts)[0].double().exp()
        assert (probs[..., V - 2:] > 0).all(), f"unseen tokens got zero probability ({smoothing}, order {order})"
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1], dtype=torch.float64),
                                   atol=1e-6, rtol=0)
    if smoothing == "kneser_ney":
        # The lowest order interpolates with the uniform distribution: after an unseen context, an unseen
        # token gets gamma(root) / V, gamma(root) the share the discounts took from the unigram counts.
        naive = NaiveKneserNey(tokens, V, 1)
        expected = naive.prob((), V - 1)
        assert expected > 0
        torch.testing.assert_close(NGramLM(V, 1).fit(torch.tensor(tokens))(torch.tensor([[V - 1]]))[0][0, 0, V - 1]
                                   .double().exp(), torch.tensor(expected, dtype=torch.float64))
    else:  # add-one: 1 / (c(h) + V), 1 / V after an unseen context
        probs = model(torch.tensor([[V - 1] * order]))[0].double().exp()
        torch.testing.assert_close(probs[0, -1, V - 2], torch.tensor(1 / V, dtype=torch.float64))


def test_order_two_add_one_is_the_bigram_baseline():
    """(count(a, b) + 1) / (count(a) + V), the figure every summary reports as bigram."""
    V = 9
    train, val = torch.tensor(corpus(V=V)), torch.tensor(corpus(500, V=V, seed=5))
    counts = Counter(zip(train[:-1].tolist(), train[1:].tolist()))
    firsts = Counter(train[:-1].tolist())
    nll = -sum(math.log((counts[(a, b)] + 1) / (firsts[a] + V)) for a, b in zip(val[:-1].tolist(), val[1:].tolist()))
    score = score_bigram(train, Split(val, torch.ones(V, dtype=torch.long)))
    assert score.tokens == 499 and score.nll == pytest.approx(nll / 499, rel=1e-6)


def test_state_carries_the_last_tokens_and_checkpoints_round_trip():
    V, order = 9, 4
    tokens = torch.tensor(corpus(V=V))
    model = NGramLM(V, order).fit(tokens)
    sequence = tokens[:50].view(2, 25)
    whole, state = model(sequence)
    first, mid = model(sequence[:, :10])
    rest, state2 = model(sequence[:, 10:], mid)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole)
    assert torch.equal(state, sequence[:, -(order - 1):]) and torch.equal(state2, state)
    assert model.context == order - 1 and model.stored_numbers() == sum(model.keys(k).numel() for k in range(1, 5))

    fresh = NGramLM(V, order)
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(fresh(sequence)[0], whole)


def test_counting_a_corpus_is_fast_and_vectorised():
    import time

    tokens = torch.randint(0, 65, (300_000,))
    started = time.perf_counter()
    NGramLM(65, 6).fit(tokens)
    assert time.perf_counter() - started < 20  # a Python loop over the tokens would take minutes


def test_bad_settings_and_a_corpus_shorter_than_one_ngram():
    assert repr(NGramLM(5, 3, "add_one")) == "NGramLM(vocab_size=5, order=3, smoothing='add_one')"  # its settings
    with pytest.raises(InvalidSetting, match=r"invalid order=0: must be an integer >= 1"):
        NGramLM(5, order=0)
    with pytest.raises(InvalidSetting, match="smoothing"):
        NGramLM(5, smoothing="witten_bell")
    with pytest.raises(UserError, match="fewer than one 6-gram"):
        NGramLM(5, 6).fit(torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("smoothing", SMOOTHINGS)
def test_a_model_never_fitted_says_so_in_one_line(smoothing):
    with pytest.raises(UserError, match=r"the 3-gram model has counted nothing: fit it"):
        NGramLM(5, 3, smoothing)(torch.tensor([[0, 1, 2]]))


@pytest.mark.parametrize("vocab, tokens, chunk", [(65, 20_000, 777), (300, 5_000, 1000), (5, 10, 3)])
def test_the_bigram_counted_in_chunks_is_the_bigram_counted_whole(vocab, tokens, chunk):
    torch.manual_seed(0)
    ids = torch.randint(vocab - 3, (tokens,))  # three tokens never seen
    whole = NGramLM(vocab, 2, "add_one").fit(ids)
    narrow = ids.to(torch.uint16 if vocab > 256 else torch.uint8)  # as a prepared split is mapped
    chunked = NGramLM(vocab, 2, "add_one").fit_in_chunks(narrow, chunk=chunk)
    for k in (1, 2):
        assert torch.equal(chunked.keys(k), whole.keys(k)) and torch.equal(chunked.counts(k), whole.counts(k))
    x = torch.randint(vocab, (2, 30))
    assert torch.equal(chunked(x)[0], whole(x)[0])
