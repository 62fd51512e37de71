"""Dynamic evaluation (study/dynamic.py): lr = 0 is the stateful figure for every trainable family, both rules
against a float64 reference written from the formulas, the same figure twice, the trained weights bit for bit
after a pass (one that raises too), the mode through the evaluation, sample.py's prompt and the API, and bad
input refused in one line with nothing changed."""

from __future__ import annotations

import math

import pytest
import torch
from evaluation_helpers import plan_of
from torch.func import functional_call

from gru_experiments.errors import UserError
from gru_experiments.models.minrnn import MinRNNLM
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.protocol import LanguageModel
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.study.dynamic import (
    EPSILON,
    DynamicSettings,
    adapted_to,
    gradient_statistics,
    score_dynamic,
)
from gru_experiments.study.evaluation import DEFAULT_EVALUATION, evaluate
from gru_experiments.study.scores import Split, score_stateful

V = 11


def build(family: str) -> LanguageModel:
    torch.manual_seed(0)
    if family in ("gru", "lstm", "rnn"):
        return RecurrentLM(V, family, embedding_dim=6, hidden_size=8, num_layers=2, dropout=0.0).eval()
    if family in ("mingru", "minlstm"):
        return MinRNNLM(V, family, embedding_dim=6, hidden_size=8, num_layers=2, dropout=0.0).eval()
    if family == "mlp":
        return BengioMLP(V, context=4, embedding_dim=3, hidden_size=7, dropout=0.0).eval()
    return TransformerLM(V, block_size=16, embedding_dim=8, num_layers=1, num_heads=2, dropout=0.0).eval()


FAMILIES = ("gru", "lstm", "rnn", "mingru", "minlstm", "transformer", "mlp")


def split(n: int = 600, seed: int = 1) -> Split:
    ids = torch.randint(V, (n,), generator=torch.Generator().manual_seed(seed))
    return Split(ids, torch.arange(V) % 3 + 1)  # uneven characters per token, as subwords have


def settings(**changes) -> DynamicSettings:
    return DynamicSettings.of({"rule": "sgd"} | changes, DEFAULT_EVALUATION)


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_lr_zero_is_the_stateful_figure_for_every_family(family):
    model, val = build(family), split()
    stateful = score_stateful(model, val, 8, 4)
    dynamic = score_dynamic(model, val, settings(lr=0.0, segment=5), 4)
    assert dynamic.score.tokens == stateful.tokens == val.n_targets
    assert abs(dynamic.score.bpc - stateful.bpc) < 1e-6
    moved = score_dynamic(model, val, settings(lr=0.05, segment=5), 4)
    assert moved.updates > 0 and moved.score.bpc != dynamic.score.bpc  # it does adapt


def reference(model, ids: torch.Tensor, s: DynamicSettings, ms: dict | None, streams: int = 1) -> torch.Tensor:
    """Both rules as the docs write them, float64, every step by hand, on `streams` streams of equal length: each
    segment's NLLs at the weights before its update; ℓ each stream's mean NLL over the segment, summed over the
    streams; θ ← θ − η g + λ(θ₀ − θ) (sgd), θ ← θ + λ r (θ₀ − θ) − η g / (MS + ε) (rms). (R, L) NLLs."""
    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    theta = {n: p.clone() for n, p in theta0.items()}
    if ms is not None:
        mean = sum(m.mean() for m in ms.values()) / len(ms)
        rate = {n: torch.minimum(m / mean, torch.tensor(1 / s.decay, dtype=m.dtype)) for n, m in ms.items()}
    rows_in, rows_out = ids[:-1].view(streams, -1), ids[1:].view(streams, -1)
    state, out = None, []
    for start in range(0, rows_in.shape[1], s.segment):
        inputs, targets = rows_in[:, start:start + s.segment], rows_out[:, start:start + s.segment]
        leaves = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
        logits, state = functional_call(model, leaves, (inputs, state))
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (R, t)
        grads = dict(zip(leaves, torch.autograd.grad(nll.mean(dim=1).sum(), list(leaves.values()))))
        out.append(nll.detach())
        state = [h.detach() for h in state]
        for n in theta:
            if ms is None:
                theta[n] = theta[n] - s.lr * grads[n] + s.decay * (theta0[n] - theta[n])
            else:
                theta[n] = theta[n] + s.decay * rate[n] * (theta0[n] - theta[n]) - s.lr * grads[n] / (ms[n] + EPSILON)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("rule", ["sgd", "rms"])
def test_both_rules_match_a_float64_reference_written_from_the_formulas(rule, streams):
    model = RecurrentLM(V, "gru", embedding_dim=4, hidden_size=5, num_layers=1, dropout=0.0).double().eval()
    val = split(41)  # 40 targets: segments of 7, the last one short
    s = settings(rule=rule, lr=0.05 if rule == "sgd" else 2e-4, decay=0.1, segment=7)
    ms = gradient_statistics(model, split(300, seed=2).ids, s) if rule == "rms" else None
    got = score_dynamic(model, val, s, streams, statistics=ms)
    expected = reference(model, val.ids, s, ms, streams)
    torch.testing.assert_close(got.score.target_nll, expected.flatten(), rtol=1e-10, atol=1e-10)
    static = reference(model, val.ids, settings(lr=0.0, segment=7), None, streams)
    assert (expected[:, 7:] - static[:, 7:]).abs().max() > 1e-4  # the updates move the later segments


def test_the_same_figure_twice_and_the_trained_weights_after_a_pass():
    model, val = build("gru"), split()
    before = weights(model)
    grads_before = [p.grad for p in model.parameters()]
    s = settings(rule="rms", lr=1e-3, decay=0.02, segment=6, reset_every=60)
    ms = gradient_statistics(model, split(800, seed=3).ids, s)
    assert same(before, weights(model))
    first, second = (score_dynamic(model, val, s, 3, statistics=ms) for _ in range(2))
    assert first.score.nll_sum == second.score.nll_sum and torch.equal(first.score.target_nll,
                                                                       second.score.target_nll)
    assert same(before, weights(model)) and [p.grad for p in model.parameters()] == grads_before
    assert all(p.requires_grad for p in model.parameters())


def test_the_trained_weights_come_back_when_a_pass_raises():
    model, val = build("lstm"), split()
    before = weights(model)
    calls = []

    def tick(tokens):  # the progress bar's, raising mid-pass: the weights have moved by then
        calls.append(tokens)
        if len(calls) == 5:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        score_dynamic(model, val, settings(lr=0.5, segment=4), 2, tick=tick)
    assert same(before, weights(model))
    with pytest.raises(RuntimeError), adapted_to(model, val.ids[:50], settings(lr=0.5, segment=4)):
        assert not same(before, weights(model))  # adapted inside the block
        raise RuntimeError
    assert same(before, weights(model))


def test_the_prompts_adaptation_and_rms_statistics_tick_every_token_they_run():
    """sample.py's bars for inference=dynamic: the adaptation to a prompt and rms's statistics count each token."""
    model, ticks = build("gru"), []
    with adapted_to(model, split(101).ids, settings(lr=0.1, segment=8), tick=ticks.append):
        assert sum(ticks) == 100 and ticks[:2] == [8, 8]  # every target of the prompt, a segment at a time
    ticks.clear()
    gradient_statistics(model, split(900).ids, settings(rule="rms", segment=5, statistics=640), tick=ticks.append)
    assert 0 < sum(ticks) <= 640 and ticks[0] == 64 * 5  # the first 640 tokens, 64 streams side by side


def test_reset_every_puts_the_trained_weights_back_at_each_multiple():
    model, val = build("gru"), split(201)
    static = score_dynamic(model, val, settings(lr=0.0, segment=10), 1).score.target_nll
    never = score_dynamic(model, val, settings(lr=0.2, segment=10), 1).score.target_nll
    # reset after every segment: each scored by the trained weights, as lr = 0 (the state as carried there)
    every = score_dynamic(model, val, settings(lr=0.2, segment=10, reset_every=10), 1).score.target_nll
    torch.testing.assert_close(every, static, rtol=0, atol=1e-6)
    # every 50: the same as never up to the first reset, then not
    fifty = score_dynamic(model, val, settings(lr=0.2, segment=10, reset_every=50), 1).score.target_nll
    torch.testing.assert_close(fifty[:50], never[:50], rtol=0, atol=0)
    assert (fifty[50:60] - never[50:60]).abs().max() > 1e-4 and (never - static).abs().max() > 1e-3


def test_params_adapt_only_their_part():
    model = build("gru")
    parts = model.dynamic_parts()
    assert parts["head"] == ["head.weight", "head.bias"]
    assert parts["recurrence"] and not set(parts["recurrence"]) & set(parts["head"])
    before = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in before.items()}
    with adapted_to(model, split(100).ids, settings(lr=0.5, segment=8, params="head")):
        moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"head.weight", "head.bias"}


@pytest.mark.parametrize("changes, words", [
    ({"lr": -1.0}, "evaluation.dynamic.lr=-1.0"),
    ({"lr": math.nan}, "evaluation.dynamic.lr=nan"),
    ({"decay": -0.1}, "evaluation.dynamic.decay=-0.1"),
    ({"decay": math.nan}, "evaluation.dynamic.decay=nan"),
    ({"segment": 0}, "evaluation.dynamic.segment=0"),
    ({"segment": 8, "reset_every": 4}, "reset_every=4: below dynamic.segment=8"),
    ({"params": "embedding"}, "evaluation.dynamic.params='embedding'"),
    ({"rule": "adam"}, "evaluation.dynamic.rule='adam'"),
    ({"step": 3}, "unknown key evaluation.dynamic.step"),
])
def test_bad_settings_are_one_line(changes, words):
    with pytest.raises(UserError) as info:
        settings(**changes)
    assert words in str(info.value) and "\n" not in str(info.value)


class HeadlessLM(LanguageModel):
    """A model with no `head` module: params=head names nothing of it."""
    family = "headless"

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(V, V)

    vocab_size = property(lambda self: V)

    def initial_state(self, batch_size, device=None):
        return None

    def forward(self, tokens, state=None):
        return self.table(tokens), None


def test_a_segment_longer_than_the_split_and_params_naming_nothing_are_one_line():
    model, val = build("gru"), split(101)
    before = weights(model)
    with pytest.raises(UserError, match="segment=40: longer than the 25 tokens"):
        score_dynamic(model, val, settings(segment=40), 4)
    with pytest.raises(UserError, match="params=head names no weight"):
        score_dynamic(HeadlessLM(), val, settings(params="head"), 1)
    assert same(before, weights(model))


def test_a_diverging_adaptation_is_marked_and_every_other_figure_kept():
    from evaluation_helpers import request_of

    model, val = build("gru"), split()
    base = {"streams": 4, "dynamic": {"lr": 0.0}}
    calm = evaluate(request_of(model, val, 8, base, train_ids=split(500, seed=5).ids))
    wild = evaluate(request_of(model, val, 8, base | {"dynamic": {"lr": 1e30}}, train_ids=split(500, seed=5).ids))
    assert wild.results["dynamic"]["diverged"] and wild.results["dynamic"]["bpc"] is None
    assert "diverged" in wild.results["dynamic"]["note"]
    summary, kept = wild.summary(), calm.summary()
    assert summary["dynamic_diverged"] is True and summary["dynamic_bpc"] is None
    for key in ("stateful_bpc", "stateless_bpc", "windowed_bpc", "bigram_bpc", "cache_gain_bpc"):
        assert summary[key] == kept[key], key
    # lr = 0 through the evaluation: the stateful figure, paired difference 0
    assert abs(kept["dynamic_bpc"] - kept["stateful_bpc"]) < 1e-6 and abs(kept["dynamic_gain_bpc"]) < 1e-9


def test_the_plan_prices_the_pass_and_samples_streams_under_a_budget():
    model = build("gru")
    sgd = {"rule": "sgd"}
    exact = plan_of(model, 5000, 8, {"streams": 8, "dynamic": sgd}, train_ids=torch.zeros(1000))
    figure = exact.figure("dynamic")
    assert figure.targets == 5000 and figure.forward_tokens == 3 * 5000  # a forward and a backward (2) per token
    rms = plan_of(model, 5000, 8, {"streams": 8, "dynamic": {"rule": "rms", "lr": 1e-4, "statistics": 800}},
                  train_ids=torch.zeros(1000))
    assert rms.figure("dynamic").forward_tokens == 3 * 5000 + 3 * 64 * 13  # its statistics: 800 tokens as 64 streams
    # its share of what the stateful figure leaves: every k-th stream, a sample; not even one stream, a note
    tight = plan_of(model, 5000, 8, {"streams": 8, "budget": 0.5, "dynamic": sgd}, training_tokens=20_000,
                    train_ids=torch.zeros(1000))
    assert tight.figure("dynamic").targets < 5000 and tight.forward_tokens <= 10_000
    assert plan_of(model, 5000, 8, {"streams": 8, "budget": 0.3, "dynamic": sgd}, training_tokens=20_000,
                   train_ids=torch.zeros(1000)).figure("dynamic") is None


def test_a_counted_model_refuses_dynamic_in_one_line():
    from gru_experiments.api import TrainedModel
    from gru_experiments.models.ngram import NGramLM
    from gru_experiments.runs.sampling import prompt_adaptation
    from gru_experiments.runs.trained_run import TrainedRun

    ngram = NGramLM(V, order=3).fit(split(500).ids)
    run = TrainedRun(ngram, None, "ngram3")
    for refuse in (lambda: TrainedModel(run).score("abc", "dynamic"),
                   lambda: TrainedModel(run).generate("abc", "dynamic"),
                   lambda: prompt_adaptation(run, "dynamic")):
        with pytest.raises(UserError) as info:
            refuse()
        assert "count" in str(info.value) and "\n" not in str(info.value)
    assert plan_of(ngram, 500, 8, {}).figure("dynamic") is None  # the run's evaluation has no such figure


def test_the_halves_of_the_validation_split_share_no_target():
    from gru_experiments.runs.trained_run import validation_half

    ids = torch.arange(11)  # 10 targets
    first, second = validation_half(ids, "first"), validation_half(ids, "second")
    assert first.tolist() == [0, 1, 2, 3, 4, 5] and second.tolist() == [5, 6, 7, 8, 9, 10]  # targets 1-5, 6-10
    assert validation_half(ids, None) is ids
    with pytest.raises(UserError, match="half='third'"):
        validation_half(ids, "third")


def test_the_cache_reads_the_dynamic_pass_as_it_reads_the_stateful_one():
    """The dynamic pass's `read` gives the cache (study/cache.py) the adapted model's states: at lr = 0 the same
    figures as over the stateful pass."""
    from gru_experiments.study.cache import StreamStates, cache_figures, stateful_states

    model, val = build("gru"), split(1200)
    _, states = stateful_states(model, val, 8, 1, targets_after=0)
    kept = []
    score_dynamic(model, val, settings(lr=0.0, segment=8), 1, read=lambda c: kept.append(StreamStates.of_chunk(c)))
    plain, dynamic = cache_figures(states, val, 8), cache_figures(StreamStates.joined(kept), val, 8)
    assert plain["by_size"].keys() == dynamic["by_size"].keys()
    for n, figure in plain["by_size"].items():
        assert abs(dynamic["by_size"][n]["bpc"] - figure["bpc"]) < 1e-6


def test_a_split_whose_streams_are_shorter_than_a_segment_gets_a_note_not_a_failure():
    from evaluation_helpers import request_of

    model, val = build("gru"), split(200)  # 64 streams of 4 tokens
    evaluation = evaluate(request_of(model, val, 8, {"streams": 64, "dynamic": {"segment": 32}},
                                     train_ids=split(500, seed=5).ids))
    summary = evaluation.summary()
    assert summary["dynamic_bpc"] is None and "shorter than evaluation.dynamic.segment=32" in summary["dynamic"]["note"]
    assert summary["stateful_bpc"] is not None
