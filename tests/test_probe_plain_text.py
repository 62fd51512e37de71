"""A model trained with the recall probe, on plain text: its figures and its samples leave the probe's
symbols out (their logits at -inf, the distribution renormalised over the corpus's own symbols), so they
compare with a twin that never had them; the recall figures keep the whole vocabulary."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_text
from evaluation_helpers import plan_of, run_plan

from gru_experiments.data.recall_probe import SymbolIds, ValidationPairs, probe_symbols, validation_plantings
from gru_experiments.data.tokenizers import CharTokenizer, plain_tokens, tokenizer_from_state
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.study.generation import Decoding, generate, sample_texts
from gru_experiments.study.modes import MODES
from gru_experiments.study.recall import score_recall
from gru_experiments.study.scores import (
    Split,
    score_bigram,
    score_chunks,
    score_contexts,
    score_stateful,
    score_stateless,
    score_windowed,
)

TEXT = make_text(400, seed=3)
SYMBOLS = probe_symbols(TEXT, 4)
EXTRA = (SYMBOLS.opening, SYMBOLS.closing, *SYMBOLS.keys)


@pytest.fixture
def probe_run():
    """A probe run's tokenizer and a tiny GRU whose head strongly prefers a probe symbol (the first key)."""
    tokenizer = CharTokenizer.from_text(TEXT, EXTRA)
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=6, hidden_size=12, num_layers=1, dropout=0.0)
    favourite = tokenizer.encode(SYMBOLS.keys[0])[0]
    with torch.no_grad():
        model.head.bias[favourite] = 8.0
    return model.eval(), tokenizer, favourite


def restricted_nll(logits: torch.Tensor, targets: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """The NLL of each target under logits (N, V) restricted to the plain tokens and renormalised: the
    reference, computed without the masking under test."""
    kept = torch.nonzero(plain).squeeze(1)
    index = torch.full((plain.numel(),), -1, dtype=torch.long)
    index[kept] = torch.arange(kept.numel())
    return -logits[:, kept].double().log_softmax(-1).gather(1, index[targets].unsqueeze(1)).squeeze(1)


def test_the_tokenizer_knows_the_probes_symbols_and_keeps_them_in_its_state():
    tokenizer = CharTokenizer.from_text(TEXT, EXTRA)
    plain = plain_tokens(tokenizer)
    assert tokenizer.chars == sorted(set(TEXT) | set(EXTRA))  # the vocabulary the probe always built
    assert plain.tolist() == [c not in EXTRA for c in tokenizer.chars]
    again = tokenizer_from_state(tokenizer.state_dict())
    assert again.extra == EXTRA and torch.equal(plain_tokens(again), plain)
    plain_tokenizer = CharTokenizer.from_text(TEXT)  # no probe: every token, a state as before
    assert plain_tokens(plain_tokenizer) is None and plain_tokenizer.state_dict().keys() == {"kind", "chars"}


def test_plain_text_figures_give_the_probes_symbols_no_probability(probe_run):
    model, tokenizer, favourite = probe_run
    ids = torch.tensor(tokenizer.encode(TEXT))
    split = Split.of(ids, tokenizer)
    plain = split.plain
    assert plain is not None and not plain[favourite] and int(plain.sum()) == tokenizer.vocab_size - len(EXTRA)
    targets = ids[1:]
    with torch.no_grad():
        logits = model(ids[:-1].unsqueeze(0))[0][0]  # every target from everything before it
        table = model(torch.arange(tokenizer.vocab_size).unsqueeze(1))[0][:, 0]  # the stateless table
    reference = restricted_nll(logits, targets, plain)
    full = F.cross_entropy(logits, targets, reduction="none").double()
    assert float((full - reference).mean()) > 1.0  # the head's favourite takes much of the full softmax

    def close(score, nll):
        assert score.tokens == targets.numel()
        assert score.nll_sum == pytest.approx(float(nll.sum()), rel=1e-5)

    stateful = score_stateful(model, split, seq_len=16, streams=1, targets_after=0)
    close(stateful, reference)
    assert torch.allclose(stateful.target_nll, reference[stateful.positions - 1], atol=1e-4)
    close(score_stateful(model, split, seq_len=50, streams=1), reference)  # one pass, as score_windowed's
    windowed = score_windowed(model, split, window=ids.numel(), targets=True)  # a window holding everything
    close(windowed, reference)
    assert torch.allclose(windowed.target_nll, reference[windowed.positions - 1], atol=1e-4)
    curve = score_contexts(model, split, 32, [1, 8, 32], stride=7)
    assert all(math.isfinite(s.bpc) for s in curve.values())
    close(score_stateless(model, split), restricted_nll(table[ids[:-1]], targets, plain))
    chunks = score_chunks(model, split, seq_len=ids.numel(), batch_size=1)  # the validation pass, one chunk
    close(chunks, reference)
    # The whole evaluation (the plan's passes, as a run scores them): its stateful figure is the reference's.
    figures = run_plan(model, ids, split, plan_of(model, split, 16, {"window": 16, "streams": 1}))
    assert figures.scores["stateful"].nll_sum == pytest.approx(float(reference.sum()), rel=1e-5)
    # The bigram baseline on the plain vocabulary is the twin's, who never had the probe's symbols.
    twin_tokenizer = CharTokenizer.from_text(TEXT)
    twin_ids = torch.tensor(twin_tokenizer.encode(TEXT))
    twin = score_bigram(twin_ids, Split.of(twin_ids, twin_tokenizer))
    assert score_bigram(ids, split).nll_sum == pytest.approx(twin.nll_sum, rel=1e-9)


def test_a_planted_text_is_scored_over_the_whole_vocabulary_and_so_are_the_recall_figures(probe_run):
    model, tokenizer, favourite = probe_run
    symbols = SymbolIds.of(SYMBOLS, tokenizer)
    ids = torch.tensor(tokenizer.encode(TEXT))
    plantings = validation_plantings(ids, ValidationPairs((4, 16), gap=8, min_targets=10), symbols, seed=0)
    assert Split.of(plantings[0].ids, tokenizer).plain is None  # it holds the probe's symbols
    with torch.no_grad():
        table = model(torch.arange(tokenizer.vocab_size).unsqueeze(1))[0][:, 0].double().log_softmax(-1)
    recall = score_recall(model, plantings, seq_len=16, window=16, keys=4)
    # The stateless recall figure is the full softmax's at every recalled key (finite: a key is a probe symbol).
    full = torch.cat([-table[q.ids[q.recall - 1], q.ids[q.recall]] / math.log(2) for q in plantings])
    bits = sum(v["stateless"]["bits"] * v["stateless"]["targets"] for v in recall["by_distance"].values())
    assert math.isfinite(bits) and bits == pytest.approx(float(full.sum()), rel=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_sampling_plain_text_never_writes_a_probe_symbol(probe_run, mode):
    model, tokenizer, favourite = probe_run
    for decoding in (Decoding(temperature=1.0), Decoding(greedy=True), Decoding(temperature=2.0, top_k=60)):
        [texts] = sample_texts(model, tokenizer, ["la "], mode=mode, max_new_tokens=120, num_samples=3,
                               decoding=decoding, seed=1, window=8)
        assert not set("".join(texts)) & set(EXTRA), decoding
    # Without the restriction the same model writes its favourite: the test has teeth.
    drawn = generate(model, tokenizer.encode("la "), mode=mode, max_new_tokens=60, decoding=Decoding(greedy=True),
                     window=8)
    assert (drawn == favourite).any()
