"""training=streams (truncated BPTT): the stream reader, the state carried across chunks in training,
exact resume, DDP ranks on their own streams, every stateful family, the context curve past the
training window and the paired stateful - windowed figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from evaluation_helpers import run_plan
from robustness_helpers import TINY, assert_untouched, error_line, fingerprint, run_script, train
from test_resume import Interrupted, interrupt_at, weights_of

from gru_experiments.data.batches import StreamBatches
from gru_experiments.errors import UserError
from gru_experiments.models.mlp import BengioMLP
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.runs.task import LanguageModelTask
from gru_experiments.study.plan import curve_lengths, plan_evaluation
from gru_experiments.study.scores import Split, paired_difference, score_contexts, score_stateful, score_windowed

V = 13


def read_pass(reader: StreamBatches) -> list[tuple]:
    """The batches of one whole pass."""
    reader.steps = reader.chunks_per_pass
    return list(reader)


# --- the stream reader ------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch, seq_len", [(1000, 4, 7), (5000, 8, 16), (97, 2, 5)])
def test_a_pass_reads_every_token_once_but_the_cut_tail(n, batch, seq_len):
    ids = torch.arange(n)  # token i is its own position
    reader = StreamBatches(ids, batch, seq_len, steps=1, seed=3)
    for pass_index in range(3):
        offset = reader.offset(pass_index)
        assert 0 <= offset < seq_len
        batches = read_pass(reader)
        assert [b[2] for b in batches] == [True] + [False] * (len(batches) - 1)  # the state resets once
        inputs = torch.cat([b[0] for b in batches], dim=1)  # (batch, stream length): the streams, chunks joined
        targets = torch.cat([b[1] for b in batches], dim=1)
        assert torch.equal(targets, inputs + 1)  # next-token targets
        read = inputs.reshape(-1)
        assert torch.equal(read, torch.arange(offset, offset + read.numel()))  # contiguous, each token once
        # The cut: the offset before, and after the streams (+ their last target) less than one chunk of
        # every stream and one more chunk (every pass has the same length, what the largest offset allows).
        assert n - read.numel() - offset - 1 < (batch + 1) * seq_len
        assert reader.pass_index == pass_index + 1 and reader.chunk == 0
    assert len({reader.offset(p) for p in range(20)}) > 1  # chunk boundaries move between passes


def test_trainer_epochs_continue_the_pass_and_the_position_round_trips():
    ids = torch.arange(2000)
    reader = StreamBatches(ids, 4, 10, steps=7, seed=0)
    first = list(reader)  # one Trainer epoch: 7 of the pass's 49 chunks
    state = reader.state_dict()
    assert state == {"pass_index": 0, "chunk": 7, "step": 7}
    older = StreamBatches(ids, 4, 10, steps=7, seed=0)
    older.load_state_dict({"pass_index": 0, "chunk": 7})  # a checkpoint from before the step was kept
    assert older.state_dict() == state
    second = list(reader)
    assert torch.equal(second[0][0], first[-1][0] + 10) and not second[0][2]  # the next chunk, carried on
    restored = StreamBatches(ids, 4, 10, steps=7, seed=0)
    restored.load_state_dict(state)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(list(restored), second))


def test_ddp_ranks_read_disjoint_streams():
    ids = torch.arange(10_000)
    world = 3
    ranks = [StreamBatches(ids, 4, 8, steps=1, seed=5, rank=r, world_size=world) for r in range(world)]
    assert len({r.chunks_per_pass for r in ranks}) == 1
    seen = [torch.cat([b[0] for b in read_pass(r)], dim=1) for r in ranks]
    tokens = [set(s.reshape(-1).tolist()) for s in seen]
    for a in range(world):
        for b in range(a + 1, world):
            assert not tokens[a] & tokens[b]
    # Together the ranks read one contiguous stretch, as a single process with world x batch streams would.
    single = torch.cat([b[0] for b in read_pass(StreamBatches(ids, 12, 8, steps=1, seed=5))], dim=1)
    assert torch.equal(torch.cat(seen), single)


def test_streams_shorter_than_one_chunk_are_refused():
    with pytest.raises(UserError, match="too few for 64 streams"):
        StreamBatches(torch.arange(5000), 64, 128, steps=1, seed=0)


@pytest.mark.slow
def test_train_py_batch_too_large_for_the_streams_is_one_line_and_writes_nothing(tmp_path, tiny_corpus):
    before = fingerprint(tmp_path)
    result = run_script(tmp_path, *TINY, f"data.path={tiny_corpus}", "training=streams", "data.batch_size=4096")
    assert result.returncode == 2
    assert "training=streams" in error_line(result.stderr) and "data.batch_size" in error_line(result.stderr)
    assert_untouched(before, fingerprint(tmp_path))


@pytest.mark.slow
def test_bad_batching_value_is_one_line(tmp_path, tiny_corpus):
    result = run_script(tmp_path, *TINY, f"data.path={tiny_corpus}", "training.batching=carried")
    assert result.returncode == 2 and "training.batching='carried'" in error_line(result.stderr)


# --- the state carried in training -------------------------------------------------------------
def families():
    torch.manual_seed(0)
    return {
        "gru": RecurrentLM(V, "gru", embedding_dim=5, hidden_size=9, num_layers=2, dropout=0.0),
        "lstm": RecurrentLM(V, "lstm", embedding_dim=5, hidden_size=9, num_layers=2, dropout=0.0, layer_norm=True),
        "rnn": RecurrentLM(V, "rnn", embedding_dim=5, hidden_size=9, num_layers=1, dropout=0.0),
        "mlp": BengioMLP(V, context=4, embedding_dim=3, hidden_size=7, dropout=0.0),
    }


@pytest.mark.parametrize("family", ["gru", "lstm", "rnn", "mlp"])
def test_two_chunks_with_the_state_carried_equal_one_pass(family):
    model = families()[family].train()  # training mode, as training runs it (dropout 0)
    tokens = torch.randint(0, V, (3, 20))
    whole, _ = model(tokens)
    first, state = model(tokens[:, :9])
    second, _ = model(tokens[:, 9:], state)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gru", "lstm", "mlp"])
def test_training_step_carries_the_detached_state_and_resets_at_a_new_pass(family):
    model = families()[family]
    task = LanguageModelTask({"_target_": "gru_experiments.models.recurrent.RecurrentLM"}, V)  # any; replaced below
    task.model = model
    task.log = lambda *args, **kwargs: None
    task.optimizers = lambda: type("O", (), {"param_groups": [{"lr": 0.0}]})()
    tokens = torch.randint(0, V, (2, 13))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    task.training_step((inputs[:, :6], targets[:, :6], True), 0)
    loss = task.training_step((inputs[:, 6:], targets[:, 6:], False), 1)
    _, expected_state = model(inputs[:, :6])
    logits, _ = model(inputs[:, 6:], expected_state)
    expected = F.cross_entropy(logits.reshape(-1, V), targets[:, 6:].reshape(-1))
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad and all(not t.requires_grad for t in _tensors(task.carried_state))
    # A new pass starts from the initial state, whatever was carried.
    restart = task.training_step((inputs[:, 6:], targets[:, 6:], True), 2)
    fresh, _ = model(inputs[:, 6:])
    torch.testing.assert_close(restart, F.cross_entropy(fresh.reshape(-1, V), targets[:, 6:].reshape(-1)))


def _tensors(state):
    if isinstance(state, (list, tuple)):
        return [t for item in state for t in _tensors(item)]
    return [state]


STREAMS = [*TINY, "training=streams", "data.seq_len=16", "model.steps_per_epoch=8", "model.epochs=2",
           "checkpoint.every_n_steps=3"]


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_interrupted_streams_run_resumes_bit_for_bit(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """As test_resume's windows run: the carried state and the stream position come back from the checkpoint."""
    base = [*STREAMS, f"data.path={tiny_corpus}"]
    uninterrupted = tmp_path / "uninterrupted"
    reference = train(compose_config(*base, f"paths.output_dir={uninterrupted}"))
    assert reference["training_mode"] == "streams"

    run = tmp_path / "run"
    interrupt_at(monkeypatch, 11)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    monkeypatch.undo()
    resumed = train(compose_config(*base, f"resume={run}"))
    assert resumed["resumed_from_step"] == 9
    for key in ("train_loss", "val_loss", "val_bpc", "stateful_bpc", "windowed_bpc", "state_gain_bpc"):
        assert resumed[key] == reference[key], key
    a, b = weights_of(run), weights_of(uninterrupted)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_a_resume_without_the_carried_state_would_differ(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """The carried state matters to the resumed numbers, so the test above can fail."""
    base = [*STREAMS, f"data.path={tiny_corpus}"]
    reference = train(compose_config(*base, f"paths.output_dir={tmp_path / 'uninterrupted'}"))
    interrupt_at(monkeypatch, 11)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    monkeypatch.undo()
    original = LanguageModelTask.on_load_checkpoint

    def forget_the_state(self, checkpoint):
        checkpoint.pop("carried_state", None)
        original(self, checkpoint)

    monkeypatch.setattr(LanguageModelTask, "on_load_checkpoint", forget_the_state)
    resumed = train(compose_config(*base, f"resume={tmp_path / 'run'}"))
    assert resumed["train_loss"] != reference["train_loss"]


@pytest.mark.parametrize("model", ["astra_alpha", "lstm", "rnn", "mlp", "scribe_alpha"])
@pytest.mark.slow
def test_every_stateful_family_trains_in_streams_mode(compose_config, tiny_corpus, model):
    overrides = [*TINY, f"data.path={tiny_corpus}", f"model={model}", "training=streams", "trainer.max_steps=4",
                 "data.seq_len=16", "evaluation.curve_longest=64", "evaluation.budget=null"]  # exact: a tiny split
    if model.startswith("scribe"):
        overrides += ["tokenizer.vocab_size=60"]
    summary = train(compose_config(*overrides))
    assert summary["status"] == "completed" and summary["training_mode"] == "streams"
    assert summary["train_steps"] == 4 and math.isfinite(summary["val_loss"])
    points = [k for k in summary["context_curve"] if k.isdigit()]
    if model == "mlp":  # a finite context (16): the curve stops at the point that holds it
        assert points[-1] == "16"
    else:
        assert points[-3:] == ["16", "32", "64"]


def test_a_counted_ngram_says_streams_change_nothing(compose_config, tiny_corpus, capsys):
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "model=ngram3", "training=streams",
                                   "evaluation.curve_longest=64"))
    assert summary["training_mode"] == "counted"
    assert "training=streams: ngram3 is counted, not trained; its counts are the same either way" in \
        capsys.readouterr().out


def test_windows_mode_records_its_mode(compose_config, tiny_corpus):
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "trainer.max_steps=2",
                                   "evaluation.curve_longest=null", "evaluation.budget=1"))
    assert summary["training_mode"] == "windows"
    assert [k for k in summary["context_curve"] if k.isdigit()][-1] == "32"  # curve_longest=null: stops at seq_len


# --- the curve past the window, and stateful - windowed ----------------------------------------
def test_long_context_lengths_double_past_the_window_where_the_split_allows():
    beyond = lambda seq_len, longest, n: curve_lengths(None, seq_len, longest, n)[1]  # noqa: E731
    assert beyond(128, 1024, 111_539) == [256, 512, 1024]
    assert beyond(128, 1024, 600) == [256, 512]
    assert beyond(128, None, 10**6) == [] and beyond(128, 200, 10**6) == []


def test_paired_difference_with_its_standard_error_against_an_independent_computation():
    torch.manual_seed(1)
    model = families()["gru"].eval()
    ids = torch.randint(0, V, (400,))
    lengths = torch.randint(1, 4, (V,))  # a subword-like vocabulary: tokens of 1-3 characters
    split = Split(ids, lengths)
    stateful = score_stateful(model, split, seq_len=16, streams=1, targets_after=0)
    streams = score_stateful(model, split, seq_len=16, streams=3, targets_after=0)  # kept targets add up to the figure
    assert streams.target_nll.sum().item() == pytest.approx(streams.nll_sum, rel=1e-12)
    assert torch.equal(streams.positions, torch.arange(1, 400))
    # targets_after=k: only targets with k tokens of their stream before them (streams of 133 targets).
    warm = score_stateful(model, split, seq_len=16, streams=3, targets_after=10)
    assert warm.positions.tolist() == [p for p in range(1, 400) if (p - 1) % 133 >= 10]
    windowed = score_contexts(model, split, 8, [8], stride=3, targets=True)[8]  # the windowed figure, sampled
    gain = paired_difference(stateful, windowed, split)  # what evaluate() records as state_gain
    # Independently: every 3rd target from position 1 (the windowed sample), each target's NLL both ways.
    positions = list(range(1, 400, 3))
    with torch.no_grad():
        full, _ = model(ids[:-1].unsqueeze(0))
        nll_s = F.cross_entropy(full[0], ids[1:], reduction="none").double()
        nll_w = []
        for u in positions:
            logits, _ = model(ids[max(0, u - 8):u].unsqueeze(0))
            nll_w.append(F.cross_entropy(logits[0, -1:], ids[u:u + 1]).double())
    d = nll_s[[u - 1 for u in positions]] - torch.stack(nll_w)
    chars = lengths[ids[positions]].double()
    assert gain.tokens == len(positions)
    assert gain.bpc == pytest.approx((d.sum() / chars.sum() / math.log(2)).item(), abs=1e-7)  # float32 NLLs
    r = d.sum() / chars.sum()
    se = torch.sqrt(((d - r * chars) ** 2).sum() / (len(positions) * (len(positions) - 1))) / chars.mean()
    assert gain.bpc_se == pytest.approx((se / math.log(2)).item(), rel=1e-3)


def test_summary_has_the_gain_and_the_long_curve(compose_config, small_shakespeare):
    # 6 steps of 8 x 16 = 768 tokens trained; a budget of 150 per token (115,200 forward tokens) holds the
    # exact windowed figure (some 6,000 targets x 16 tokens) and leaves about 19,000 to the points past the window.
    cfg = compose_config(*TINY, f"data.path={small_shakespeare}", "trainer.max_steps=6", "training=streams",
                         "data.seq_len=16", "evaluation.curve_longest=128", "evaluation.budget=150")
    summary = train(cfg)
    assert json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())["state_gain_bpc"] == \
        summary["state_gain_bpc"]
    curve = summary["context_curve"]
    assert [k for k in curve if k.isdigit()] == ["1", "2", "4", "8", "16", "32", "64", "128"]
    settings, scored = curve["settings"], summary["mode_evaluation"]
    assert scored["budget"] == 150 * 768 and scored["windowed_stride"] == 1  # the windowed figure fits: exact
    windowed = next(row for row in scored["plan"] if row["name"] == "windowed")
    assert settings["longest"] == 128 and settings["stride"]["32"] == settings["stride"]["128"] > 1
    # The points past the window share what the windowed figure left of the budget.
    long_tokens = sum(settings["forward_tokens"][w] for w in ("32", "64", "128"))
    assert 0 < long_tokens <= scored["budget"] - windowed["forward_tokens"]
    assert settings["bpc_se"]["64"] > 0 and settings["bpc_se"]["16"] == 0
    # The paired difference leaves out each stream's first window of targets (its state has seen less).
    assert abs(summary["state_gain_bpc"] - (summary["stateful_bpc"] - summary["windowed_bpc"])) < 0.05
    assert summary["state_gain_se"] > 0


@pytest.mark.slow
def test_ddp_streams_run_two_ranks_on_their_own_streams(tmp_path, tiny_corpus):
    """Two CPU processes (gloo), each on its own streams; the checkpoint holds both ranks' states."""
    run_dir = tmp_path / "ddp_streams"
    result = run_script(tmp_path, *STREAMS, f"data.path={tiny_corpus}", "trainer=ddp", "trainer.devices=2",
                        "trainer.max_steps=6", f"hydra.run.dir={run_dir}", "evaluation.curve_longest=64",
                        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["training_mode"] == "streams" and summary["train_steps"] == 6
    from gru_experiments.runs.checkpoints import read_checkpoint

    ranks = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["carried_state"]
    assert len(ranks) == 2 and not torch.equal(ranks[0][0], ranks[1][0])  # one GRU layer's h per rank, different


def test_long_points_are_difference_estimates_exact_without_a_budget():
    """Past the training window (8) a curve point is the seq_len point plus a paired difference from a
    reference pass at seq_len on the same targets: exact without a budget (each point its own
    score_windowed), sampled within what the budget leaves after the exact windowed figure."""
    torch.manual_seed(2)
    model = families()["gru"].eval()
    ids = torch.randint(0, V, (300,))
    split = Split(ids, torch.ones(V, dtype=torch.long))

    def plan(budget):
        return plan_evaluation(model, split.n_targets, seq_len=8, window=8, streams=1, budget=budget, bigram=False,
                               curve_longest=64)

    exact_plan = plan(None)
    budget = exact_plan.figure("windowed").forward_tokens + 3_000  # the windowed figure exact, 3,000 for the rest
    sampled_plan = plan(budget)
    assert sampled_plan.passes[sampled_plan.figure("windowed").passes[0]].stride == 1
    exact, sampled = (run_plan(model, None, split, p).curve for p in (exact_plan, sampled_plan))
    assert exact["8"] == sampled["8"] == pytest.approx(score_windowed(model, split, 8).bpc, abs=1e-9)
    for w in (16, 32, 64):
        assert exact[str(w)] == pytest.approx(score_windowed(model, split, w).bpc, abs=1e-9)
        assert exact["settings"]["bpc_se"][str(w)] == 0.0
        settings = sampled["settings"]
        assert settings["stride"][str(w)] > 1 and settings["bpc_se"][str(w)] > 0
        reference, own = (sampled_plan.passes[i] for i in sampled_plan.figure(f"curve {w}").passes)
        assert (reference.window, own.window) == (8, w) and reference.stride == own.stride  # the same targets
        # The estimate is the exact window-8 figure plus a paired difference: within a few standard errors.
        assert abs(sampled[str(w)] - exact[str(w)]) < 4 * settings["bpc_se"][str(w)] + 1e-6
    assert sum(sampled["settings"]["forward_tokens"][str(w)] for w in (16, 32, 64)) <= 3_000


def test_score_contexts_with_no_full_window_in_the_sample_scores_the_rest():
    """A stride so large that no target has a full window in the sample: nothing runs on zero windows."""
    model = families()["gru"].eval()
    batches = []
    forward = model.forward
    model.forward = lambda tokens, state=None: (batches.append(tokens.shape[0]), forward(tokens, state))[1]
    split = Split(torch.randint(0, V, (60,)), torch.ones(V, dtype=torch.long))
    scores = score_contexts(model, split, window=50, contexts=[50], stride=40)
    assert scores[50].tokens == len([u for u in range(1, 60) if (u - 1) % 40 == 0])
    assert batches and min(batches) > 0  # (the bf16 head cannot take an empty batch)
