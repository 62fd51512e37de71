"""The transformer family: its attention against an independent softmax(QKᵀ/√d + mask)·V, no position
seeing a later token, the protocol's state (the last block_size tokens, as nanoGPT crops them), its
configs' parameter counts and nanoGPT's shakespeare_char model through train.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from gru_experiments.models.protocol import build_model, count_parameters
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.study.generation import Decoding, make_chooser, sample_tokens
from gru_experiments.validation import InvalidSetting

REPO = Path(__file__).resolve().parents[1]
V = 11


def build(block_size: int = 6, **settings) -> TransformerLM:
    torch.manual_seed(0)
    settings = dict(embedding_dim=8, num_layers=2, num_heads=2, dropout=0.0, bias=True) | settings
    return TransformerLM(V, block_size=block_size, **settings).eval()


def plain_attention(attention, x: torch.Tensor, alibi: bool = False) -> torch.Tensor:
    """softmax(Q Kᵀ / √d + mask) V per head, written out from the layer's weights, then its projection; with
    alibi, head j's score for a key i - k positions back lowered by (i - k) / 2^(8(j+1)/h), the paper's slopes."""
    T, C = x.shape
    h = attention.heads
    d = C // h
    W, b = attention.qkv.weight, attention.qkv.bias
    q, k, v = (x @ W[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C] for i in range(3))
    mask = torch.full((T, T), float("-inf")).triu(1)  # position i may see j <= i
    heads = []
    for j in range(h):
        s = slice(j * d, (j + 1) * d)
        bias = mask.clone()
        if alibi:
            for i in range(T):
                for key in range(i + 1):
                    bias[i, key] = -(i - key) / 2 ** (8 * (j + 1) / h)
        heads.append(torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(d) + bias, dim=-1) @ v[:, s])
    return torch.cat(heads, dim=1) @ attention.proj.weight.T + attention.proj.bias


def test_causal_attention_matches_a_plain_softmax_over_the_same_weights():
    model = build(block_size=16, embedding_dim=12, num_heads=3)
    attention = model.blocks[0].attention
    x = torch.randn(2, 9, 12)
    with torch.no_grad():
        fused = attention(x)
        for i in range(2):
            torch.testing.assert_close(fused[i], plain_attention(attention, x[i]), atol=1e-5, rtol=1e-5)


def test_the_whole_model_matches_a_plain_forward():
    """Embeddings, pre-LayerNorm blocks, final LayerNorm and the tied head, recomputed by hand."""
    model = build(block_size=16)
    tokens = torch.randint(0, V, (1, 7))
    with torch.no_grad():
        logits, _ = model(tokens)
        x = model.wte.weight[tokens[0]] + model.wpe.weight[:7]
        for block in model.blocks:
            x = x + plain_attention(block.attention, block.ln_1(x))
            x = x + block.mlp.proj(torch.nn.functional.gelu(block.mlp.fc(block.ln_2(x))))
        expected = model.ln_f(x) @ model.wte.weight.T
    torch.testing.assert_close(logits[0], expected, atol=1e-5, rtol=1e-5)


def test_alibi_positions_match_a_plain_forward_with_the_papers_slopes():
    """positions=alibi: no position table; each head's scores lowered by the key's distance (Press et al. 2022)."""
    model = build(block_size=16, num_heads=2, positions="alibi")
    assert model.wpe is None and count_parameters(model) == count_parameters(build(block_size=16)) - 16 * 8
    tokens = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        logits, _ = model(tokens)
        x = model.wte.weight[tokens[0]]
        for block in model.blocks:
            x = x + plain_attention(block.attention, block.ln_1(x), alibi=True)
            x = x + block.mlp.proj(torch.nn.functional.gelu(block.mlp.fc(block.ln_2(x))))
        expected = model.ln_f(x) @ model.wte.weight.T
    torch.testing.assert_close(logits[0], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(InvalidSetting, match="positions"):
        build(positions="rope")


@pytest.mark.parametrize("positions", ["learned", "alibi"])
@pytest.mark.parametrize("length", [5, 14])  # within the block, and past it (each position its own window)
def test_no_position_sees_a_later_token(length, positions):
    model = build(block_size=6, positions=positions)
    tokens = torch.randint(0, V, (2, length))
    with torch.no_grad():
        before, _ = model(tokens)
        for t in range(length):
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 1) % V
            after, _ = model(changed)
            torch.testing.assert_close(after[:, :t], before[:, :t], atol=0, rtol=0)
            assert not torch.allclose(after[:, t], before[:, t])  # the position itself does see it


def test_it_sees_exactly_the_last_block_size_tokens_cropped_as_nanogpt():
    """Past the block, position t is predicted from tokens t - block + 1 .. t alone, the oldest at position 0."""
    model = build(block_size=6)
    tokens = torch.randint(0, V, (1, 20))
    with torch.no_grad():
        logits, _ = model(tokens)
        for t in range(20):
            crop = tokens[:, max(0, t - 5):t + 1]  # nanoGPT's idx[:, -block_size:]
            alone, _ = model(crop)
            torch.testing.assert_close(logits[:, t], alone[:, -1], atol=1e-5, rtol=1e-5)


def test_the_state_continues_a_sequence():
    model = build(block_size=6)
    tokens = torch.randint(0, V, (3, 17))
    with torch.no_grad():
        whole, _ = model(tokens)
        state, parts = None, []
        for start, end in ((0, 4), (4, 5), (5, 13), (13, 17)):  # within the block, one token, past the block
            logits, state = model(tokens[:, start:end], state)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(state, tokens[:, -6:]) and model.context == 6


def test_empty_input():
    model = build(block_size=6)
    for shape in ((0, 3), (2, 0)):
        logits, _ = model(torch.zeros(shape, dtype=torch.long))
        assert logits.shape == (*shape, V)


def test_stateless_sees_the_last_token_and_stateful_equals_windowed():
    model = build(block_size=6)
    a, b = torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), torch.tensor([[9, 8, 0, 0, 2, 1, 7]])
    sample = lambda prompt, mode, seed=3: sample_tokens(  # noqa: E731
        model, prompt, 25, mode, make_chooser(Decoding(), torch.Generator().manual_seed(seed)), window=50)
    assert torch.equal(sample(a, "stateless"), sample(b, "stateless"))
    assert torch.equal(sample(a, "stateful", 5), sample(a, "windowed", 5))


@pytest.mark.parametrize("key,value,message", [
    ("num_heads", 3, "invalid num_heads=3: must be a divisor of embedding_dim (8)"),
    ("block_size", 0, "invalid block_size=0: must be an integer >= 1"),
    ("dropout", 1.0, "invalid dropout=1.0"),
    ("bias", "no", "invalid bias='no': must be true or false"),
    ("attention_dropout", -0.1, "invalid attention_dropout=-0.1: must be a number in"),
    ("tie_head", 1, "invalid tie_head=1: must be true or false"),
])
def test_bad_settings_are_refused(key, value, message):
    from gru_experiments.models.protocol import InvalidSetting

    with pytest.raises(InvalidSetting, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(**{key: value})


# The sizes it faces: Astra-α 86,913 and Astra-β 715,713 (within 5%); nanoGPT's shakespeare_char 10.65M (1%,
# nanoGPT's count, which leaves out the position embeddings: 10,646,784).
@pytest.mark.parametrize("name,expected,rival,tolerance", [
    ("transformer", 87_480, 86_913, 0.05), ("transformer_beta", 723_240, 715_713, 0.05),
    ("nanogpt_shakespeare", 10_745_088, 10_650_000, 0.01)])
def test_parameter_counts(compose_config, name, expected, rival, tolerance):
    cfg = compose_config(f"model={name}")
    model = build_model(OmegaConf.to_container(cfg.model.architecture), 65)
    assert count_parameters(model) == expected and abs(expected / rival - 1) <= tolerance
    if name == "nanogpt_shakespeare":
        assert expected - model.wpe.weight.numel() == 10_646_784 and cfg.data.seq_len == 256
    else:
        assert cfg.data.seq_len == 128 == model.context


@pytest.mark.slow
def test_nanogpt_shakespeare_fast_dev_run_through_train_py(tmp_path, shakespeare):
    env = dict(os.environ, PROJECT_ROOT=str(tmp_path), PYTHONPATH=str(REPO), WANDB_MODE="disabled")
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "model=nanogpt_shakespeare", f"data.path={shakespeare}",
         "trainer.fast_dev_run=true", "data.batch_size=2",
         "data.train_fraction=0.99995",  # 56 validation characters, fewer than a block: every evaluation one pass
         "trainer.accelerator=cpu", "logger=none",
         "trainer.enable_progress_bar=false", "evaluation.samples.chars=10",
         "evaluation.budget=null",  # every figure exact: on 55 targets, a few thousand forward tokens
         "evaluation.streams=4",  # fewer streams than the 55 targets (64 would be refused)
         f"paths.log_dir={tmp_path / 'outputs'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainable parameters: 10,745,088" in result.stdout
    assert "nanogpt_shakespeare: train loss" in result.stdout


def test_the_head_is_tied_to_the_embeddings_unless_told_otherwise():
    tied = build()
    assert tied.head.weight is tied.wte.weight
    untied = build(tie_head=False)
    assert untied.head.weight.data_ptr() != untied.wte.weight.data_ptr()
    assert count_parameters(untied) == count_parameters(tied) + V * 8


def test_attention_dropout_defaults_to_dropout_and_may_be_turned_off():
    assert build(dropout=0.2).blocks[0].attention.dropout == 0.2  # nanoGPT's attn_dropout = dropout
    model = build(dropout=0.2, attention_dropout=0.0).train()
    assert model.blocks[0].attention.dropout == 0.0 and model.blocks[0].mlp.dropout.p == 0.2
    tokens = torch.randint(0, V, (2, 5))
    with torch.no_grad():  # no dropout anywhere but on the attention weights: the forward is deterministic
        quiet = build(dropout=0.0, attention_dropout=0.0).train()
        torch.testing.assert_close(quiet(tokens)[0], quiet(tokens)[0])
        noisy = build(dropout=0.0, attention_dropout=0.5).train()
        assert not torch.allclose(noisy(tokens)[0], noisy(tokens)[0])


def test_a_stateful_figure_past_the_block_is_sampled_from_each_targets_own_block():
    """A transformer's stateful step past its block runs a block per prediction, so within a small budget
    its plan scores every k-th target from its own block, however long the chunks of the stateful pass
    (here 16, twice the block); each such target scored independently agrees, and without a budget the
    figure is the stateful pass itself. (tests/test_plan.py: the stride's rule, and that a recurrent
    model's stateful figure is exact whatever the budget.)"""
    import torch.nn.functional as F
    from evaluation_helpers import run_plan

    from gru_experiments.study.plan import plan_evaluation
    from gru_experiments.study.scores import Split, score_stateful

    ids = torch.randint(0, V, (300,), generator=torch.Generator().manual_seed(2))
    split = Split(ids, torch.ones(V, dtype=torch.long))
    model = build(block_size=8)
    assert model.tokens_per_prediction == 8

    def plan(budget):
        return plan_evaluation(model, split.n_targets, seq_len=16, window=16, streams=4, budget=budget,
                               windowed=False, bigram=False, curve=False)

    sampled = plan(600)  # 299 x 8 > 600
    stateful = sampled.passes[sampled.figure("stateful").passes[0]]
    assert (stateful.kind, stateful.window, stateful.contexts) == ("windows", 8, (8,)) and stateful.stride > 1
    assert stateful.forward_tokens <= 600
    sample = run_plan(model, None, split, sampled).scores["stateful"]
    targets = list(range(1, 300, stateful.stride))
    with torch.no_grad():  # each target from the block before it, as the model sees it statefully
        nll = [F.cross_entropy(model(ids[max(0, u - 8):u].unsqueeze(0))[0][0, -1:], ids[u:u + 1]) for u in targets]
    assert sample.tokens == len(targets) == sampled.figure("stateful").targets and sample.sampling_se > 0
    assert sample.nll == pytest.approx(torch.stack(nll).mean().item(), abs=1e-5)
    whole = run_plan(model, None, split, plan(None)).scores["stateful"]
    assert whole.tokens == 299 and whole.sampling_se == 0
    assert whole.nll == pytest.approx(score_stateful(model, split, 16, 4).nll, abs=1e-6)


@pytest.mark.slow
def test_train_py_then_sample_py_in_every_mode_and_the_curve_stops_at_the_block(compose_config, tiny_corpus, tmp_path,
                                                                                monkeypatch):
    """A short run: the context curve stops at the block size (8), curve_longest notwithstanding; the
    stateful figure, a block per target, is sampled within the budget both at validation (evaluation.budget
    x an epoch's tokens) and at the end of the run (x the run's tokens), the latter scoring the targets its
    plan names; and sample.py runs in all three modes from the checkpoint."""
    import json

    from evaluation_helpers import plan_of
    from robustness_helpers import train

    import gru_experiments
    from gru_experiments.data.corpus import prepare_corpus
    from gru_experiments.runs import trained_run
    from gru_experiments.study.plan import OVER_TRAINING
    from gru_experiments.study.scores import Split, score_contexts

    validations, evaluate = [], trained_run.evaluate_plan  # behind the evaluation door: the Request it runs

    def recorded(request, *args, **kwargs):  # the modes at every validation (ModesOverTraining), kept for a look
        evaluation = evaluate(request, *args, **kwargs)
        if request.purpose == OVER_TRAINING:
            validations.append(evaluation)
        return evaluation

    monkeypatch.setattr(trained_run, "evaluate_plan", recorded)
    cfg = compose_config("model=transformer", f"data.path={tiny_corpus}", "model.architecture.block_size=8",
                         "data.batch_size=4", "data.seq_len=8", "trainer.max_steps=3", "model.steps_per_epoch=3",
                         "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "evaluation.samples.chars=20")
    summary = train(cfg)
    curve = summary["context_curve"]
    assert [key for key in curve if key not in ("settings", "stateful", "by_class")] == ["1", "2", "4", "8"]
    assert curve["settings"]["longest"] == 8
    n = summary["mode_evaluation"]["split_targets"]
    budget = float(cfg.evaluation.budget)
    # At validation (one, at the end of the epoch of 3 steps x 4 x 8 tokens): stateful and stateless only,
    # the stateful figure sampled within the budget of an epoch's tokens.
    assert len(validations) == 1 and set(validations[0].modes.scores) == {"stateful", "stateless"}
    plan, stateful = validations[0].plan, validations[0].modes.scores["stateful"]
    assert plan.budget == math.floor(budget * 3 * 4 * 8) < n * 8  # so validation sampled its stateful figure
    assert stateful.tokens == plan.figure("stateful").targets < n and stateful.sampling_se > 0
    assert plan.figure("stateful").forward_tokens <= plan.budget  # what it runs: test_plan counts it
    assert "val/stateful_bpc" in (Path(cfg.paths.output_dir) / "history.csv").read_text()
    # At the end of the run: the plan of the run's tokens, as recorded, and the stateful figure it names.
    on_disk = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    model = gru_experiments.load(on_disk["checkpoint"]).model
    plan = plan_of(model, n, 8, cfg.evaluation, summary["train_tokens"])
    assert plan.budget == math.floor(budget * summary["train_tokens"]) and on_disk["mode_evaluation"]["plan"] == \
        plan.record()
    figure = plan.figure("stateful")
    stride = plan.passes[figure.passes[0]].stride
    assert figure.forward_tokens <= plan.budget < n * 8 and figure.targets < n  # bounded: sampled too
    assert curve["settings"]["targets"]["stateful"] == figure.targets
    corpus = prepare_corpus(cfg.data, cfg.tokenizer, Path(cfg.paths.data_dir) / "tokenizers")
    val = Split.of(corpus.val_ids, corpus.tokenizer)
    assert val.n_targets == n
    assert on_disk["stateful_bpc"] == pytest.approx(score_contexts(model, val, 8, [8], stride)[8].bpc, abs=1e-9)
    env = dict(os.environ, PROJECT_ROOT=str(tmp_path), PYTHONPATH=str(REPO), WANDB_MODE="disabled")
    for mode in ("stateful", "stateless", "windowed"):
        result = subprocess.run([sys.executable, str(REPO / "sample.py"), f"paths.log_dir={tmp_path / 'outputs'}",
                                 "device=cpu", f"ckpt={on_disk['checkpoint']}", f"inference={mode}",
                                 "prompt='MARÍA: '", "max_new_tokens=12"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"=== 'MARÍA: ' [{mode}, sample 1/1]" in result.stdout
