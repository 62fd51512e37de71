"""The cache figure (study/cache.py): the continuous and the count cache against a direct loop on a tiny case,
λ = 0 giving the model's own figure exactly, the stateful pass unchanged by keeping its states, and the entry in a
short run's summary.json (strict JSON)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from robustness_helpers import train

from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.study import cache as cache_module
from gru_experiments.study.cache import (
    cache_figures,
    cache_sizes,
    continuous_cache,
    count_cache,
    interpolate,
    stateful_states,
)
from gru_experiments.study.generation import eval_mode
from gru_experiments.study.scores import Split, score_stateful


def _loop_continuous(hidden, targets, size, theta):
    R, L, _ = hidden.shape
    out = torch.full((R, L), -math.inf, dtype=torch.float64)
    for r in range(R):
        for p in range(L):
            keys = range(max(0, p - size), p)
            weights = [math.exp(theta * float(hidden[r, p].double() @ hidden[r, i].double())) for i in keys]
            hits = sum(w for w, i in zip(weights, keys) if targets[r, i] == targets[r, p])
            if weights and hits:
                out[r, p] = math.log(hits / sum(weights))
    return out


def test_the_continuous_cache_is_the_direct_sum_over_the_last_n_positions(monkeypatch):
    torch.manual_seed(0)
    hidden, targets = torch.randn(2, 40, 5), torch.randint(0, 4, (2, 40))
    monkeypatch.setattr(cache_module, "CHUNK_ELEMENTS", 2 * 2 * 8)  # many query chunks, each against its keys
    sizes, thetas = [3, 8, 16], [0.0, 0.3, 1.5]
    fast = continuous_cache(hidden, targets, sizes, thetas)
    every_third = continuous_cache(hidden, targets, sizes, thetas, stride=3)  # a CPU's sample: every 3rd query
    for k, size in enumerate(sizes):
        for j, theta in enumerate(thetas):
            direct = _loop_continuous(hidden, targets, size, theta)
            torch.testing.assert_close(fast[k, j].double(), direct, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(every_third[k, j].double(), direct[:, ::3], rtol=1e-5, atol=1e-5)


def test_the_count_cache_is_the_direct_count_of_the_last_n_tokens():
    torch.manual_seed(1)
    ids = torch.randint(0, 5, (60,))
    positions = torch.arange(2, 60)
    sizes, weights = [4, 10], [0.0, 0.5, 1.0]
    fast = count_cache(ids, positions, sizes, weights)
    for k, n in enumerate(sizes):
        for j, beta in enumerate(weights):
            for i, u in enumerate(positions.tolist()):
                window = ids[max(0, u - n):u].tolist()
                unigram = window.count(ids[u].item()) / len(window)
                pairs = list(zip(window, window[1:]))
                context = sum(a == ids[u - 1].item() for a, _ in pairs)
                bigram = sum(p == (ids[u - 1].item(), ids[u].item()) for p in pairs) / max(context, 1)
                expected = beta * bigram + (1 - beta) * unigram if context else unigram
                assert math.exp(fast[k, j, i]) == pytest.approx(expected, abs=1e-12), (n, beta, u)


def _states(model, n=600, seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(0, 7, (n,))
    split = Split(ids, torch.ones(7, dtype=torch.long))
    kept, states = stateful_states(model, split, 16, 4, targets_after=16)
    plain = score_stateful(model, split, 16, 4, targets_after=16)
    return split, kept, plain, states


@pytest.mark.parametrize("make", [lambda: RecurrentLM(7, "gru", embedding_dim=6, hidden_size=8, num_layers=2),
                                  lambda: TransformerLM(7, block_size=16, embedding_dim=8, num_layers=1, num_heads=2)])
def test_keeping_the_states_leaves_the_stateful_figures_as_they_were(make):
    model = make()
    split, kept, plain, states = _states(model)
    assert (kept.nll_sum, kept.tokens, kept.moments) == (plain.nll_sum, plain.tokens, plain.moments)
    assert torch.equal(kept.positions, plain.positions) and torch.equal(kept.target_nll, plain.target_nll)
    assert states.hidden.shape == (4, 150, 8) and states.hidden.dtype == torch.bfloat16
    # Row 0's states are those the model's last norm gives on the stream, read directly.
    with eval_mode(model), torch.no_grad():
        if isinstance(model, RecurrentLM):
            recorded, state = [], None
            for start in range(0, 150, 16):
                x = model.embedding(split.ids[None, start:min(start + 16, 150)])
                new = []
                for layer, h in zip(model.layers, state or [None] * len(model.layers)):
                    x, h = layer(x, h)
                    new.append(h)
                state = new
                recorded.append(model.norm(x))
            direct = torch.cat(recorded, dim=1)[0]
        else:  # the transformer, position 20: its last block_size tokens
            direct = model.ln_f(model.hidden(split.ids[None, 5:21]))[0, -1:]
            states = type(states)(states.rows, states.length, states.nll, states.hidden[:, 20:21])
    torch.testing.assert_close(states.hidden[0].float(), direct.to(torch.bfloat16).float())


def test_lambda_zero_gives_the_model_s_own_figure_exactly(monkeypatch):
    model = RecurrentLM(7, "gru", embedding_dim=6, hidden_size=8, num_layers=1)
    split, _, _, states = _states(model, n=2000)
    nll = states.nll.reshape(-1)[:100].double()
    assert torch.equal(interpolate(nll, torch.randn(100), 0.0), nll)
    monkeypatch.setattr(cache_module, "LAMBDAS", (0.0,))
    for count in (False, True):
        record = cache_figures(states, split, 16, count=count)
        assert record["sizes"] == cache_sizes(16, 1999) == [16, 128, 256, 512, 1024]  # the streams: one segment
        for figures in record["by_size"].values():
            assert figures["bpc"] == record["model_bpc"] and figures["gain_bpc"] == 0.0
            assert figures["past_window_bpc"] in (None, 0.0)


def test_the_count_cache_serves_a_counted_model():
    ids = torch.randint(0, 7, (2000,), generator=torch.Generator().manual_seed(2))
    model = NGramLM(7, order=3).fit(ids[:1500])
    split = Split(ids[1500:], torch.ones(7, dtype=torch.long))
    _, states = stateful_states(model, split, 16, 4)
    assert states.hidden is None  # the n-gram has no final hidden states (forward_features: None)
    record = cache_figures(states, split, 16)
    assert record["kind"] == "count" and record["sizes"] == [16, 128, 256]


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_a_short_run_s_summary_has_the_cache_figures(compose_config, small_shakespeare, capsys):
    cfg = compose_config(f"data.path={small_shakespeare}", "data.batch_size=4", "data.seq_len=16",
                         "trainer.max_steps=3", "model.steps_per_epoch=3", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.text.samples=0", "evaluation.samples.chars=20",
                         "evaluation.streams=2", "evaluation.curve_longest=null")  # a kept stream of ~3,000 tokens
    summary = train(cfg)
    on_disk = _strict((Path(cfg.paths.output_dir) / "summary.json").read_text())
    for key in ("cache_size", "cache_gain_bpc", "cache_gain_se", "cache_past_window_bpc", "cache_past_window_se"):
        assert key in on_disk and on_disk[key] == summary[key]
    record = on_disk["cache"]
    assert record["kind"] == "continuous" and record["window"] == 16 and record["sizes"][0] == 16
    # a CPU under a budget: every 4th position queried at the least, sparser where the queries would cost more
    # than the plan's passes (3,109 forward tokens here: a query against 4,096 keys is priced at 16)
    forward = on_disk["mode_evaluation"]["forward_tokens"]
    assert record["every"] == max(cache_module.CPU_STRIDE, math.ceil(3002 * 16 / forward)) > cache_module.CPU_STRIDE
    assert record["fit_targets"] + record["test_targets"] <= math.ceil(3002 / record["every"])
    assert record["longest"] == on_disk["cache_size"] == record["sizes"][-1] >= 128
    assert math.isfinite(on_disk["cache_gain_bpc"]) and on_disk["cache_gain_se"] > 0
    assert "continuous cache over the last N tokens" in capsys.readouterr().out
