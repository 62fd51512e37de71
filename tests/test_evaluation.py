"""The inference modes measured: every scorer is checked against a plain, independent computation,
the bigram baseline against counts by hand, and the study's claim on a briefly trained model."""

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import strict_json
from evaluation_helpers import plan_of, run_plan
from omegaconf import OmegaConf
from robustness_helpers import TINY, train

from gru_experiments.data.batches import RandomWindowBatches
from gru_experiments.data.corpus import split_text
from gru_experiments.data.tokenizers import CharTokenizer
from gru_experiments.models.ngram import NGramLM
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.runs.loggers import read_history
from gru_experiments.runs.scoring import score_best
from gru_experiments.runs.trained_run import load
from gru_experiments.study.evaluation import EvaluationSettings, curve_points
from gru_experiments.study.generation import eval_mode
from gru_experiments.study.plan import curve_lengths, plan_evaluation
from gru_experiments.study.scores import (
    Score,
    Split,
    score_bigram,
    score_contexts,
    score_stateful,
    score_stateless,
    score_table,
    score_windowed,
    stateless_log_probs,
)
from gru_experiments.study.target_classes import CLASSES
from gru_experiments.study.text_index import TrainingIndex
from gru_experiments.study.text_protocol import DECODERS
from gru_experiments.study.text_stats import text_statistics

V = 11


@pytest.fixture(params=["gru", "lstm"])
def model(request):
    torch.manual_seed(0)
    return RecurrentLM(V, request.param, embedding_dim=5, hidden_size=8, num_layers=2, dropout=0.3).double().eval()


@pytest.fixture
def ids():
    return torch.randint(V, (150,), generator=torch.Generator().manual_seed(1))


def lengths(vocab=V):
    """Uneven characters per token, as a subword vocabulary has, so bpc is really per character."""
    return torch.arange(vocab) % 3 + 1


def split(ids):
    return Split(ids, lengths())


def nll_of(model, context: torch.Tensor, target: int) -> float:
    """-log p(target | context) from a zero state: one plain forward pass."""
    with torch.no_grad():
        logits, _ = model(context.unsqueeze(0))
    return -F.log_softmax(logits[0, -1], -1)[target].item()


def check_score(score, nlls: list[float], targets: torch.Tensor):
    assert score.tokens == len(nlls) == targets.numel()
    assert score.nll_sum == pytest.approx(sum(nlls), rel=1e-6)  # score_batch sums in float32
    assert score.characters == int(lengths()[targets].sum())
    assert score.bpc == pytest.approx(sum(nlls) / math.log(2) / score.characters, rel=1e-6)


@pytest.mark.parametrize("streams", [1, 4, 149, 500])
def test_stateful_is_each_stream_in_one_pass(model, ids, streams):
    score = score_stateful(model, split(ids), seq_len=7, streams=streams)
    # Each stream run whole in one forward pass: carrying the state across chunks changes nothing.
    n = ids.numel() - 1
    per_stream = -(-n // min(streams, n))
    nlls = []
    for start in range(0, n, per_stream):
        inputs, targets = ids[start:min(start + per_stream, n)], ids[start + 1:min(start + per_stream, n) + 1]
        with torch.no_grad():
            logits, _ = model(inputs.unsqueeze(0))
        nlls += (-F.log_softmax(logits[0], -1).gather(1, targets.unsqueeze(1))).flatten().tolist()
    check_score(score, nlls, ids[1:])


def test_stateless_is_every_target_from_its_previous_token_alone(model, ids):
    score = score_stateless(model, split(ids))
    nlls = [nll_of(model, ids[t - 1:t], ids[t].item()) for t in range(1, ids.numel())]
    check_score(score, nlls, ids[1:])
    assert stateless_log_probs(model).shape == (V, V)


@pytest.mark.parametrize("window,stride", [(6, 1), (6, 7), (1, 1), (500, 3)])
def test_windowed_is_every_target_from_its_own_window(model, ids, window, stride):
    # Every stride-th target from its own window (the evaluation's sample: score_contexts at one context).
    score = score_windowed(model, split(ids), window) if stride == 1 else \
        score_contexts(model, split(ids), window, [window], stride)[window]
    positions = range(1, ids.numel(), stride)
    nlls = [nll_of(model, ids[max(0, t - window):t], ids[t].item()) for t in positions]
    check_score(score, nlls, ids[list(positions)])


def test_windowed_extremes_are_stateless_and_stateful(model, ids):
    # A one-token window is the stateless model; a window covering everything is one stream.
    assert score_windowed(model, split(ids), 1).nll == pytest.approx(score_stateless(model, split(ids)).nll)
    assert score_windowed(model, split(ids), 1000).nll == pytest.approx(
        score_stateful(model, split(ids), 5, 1).nll)
    # A window of no token, a context past the window or a stride of none: refused, never a figure.
    with pytest.raises(ValueError, match="^window must be >= 1, got 0$"):
        score_windowed(model, split(ids), 0)
    for contexts, stride in (([1, 7], 1), ([0], 1), ([2], 0)):
        with pytest.raises(ValueError, match=re.escape(f"contexts must lie in 1..6 and stride be >= 1, got "
                                                       f"{contexts} and {stride}")):
            score_contexts(model, split(ids), 6, contexts, stride)


def test_bigram_counts_by_hand():
    train_ids = torch.tensor([0, 1, 0, 1, 1, 2])  # pairs: 0>1, 1>0, 0>1, 1>1, 1>2
    expected = torch.tensor([[1 / 5, 3 / 5, 1 / 5],  # from 0: counts (0, 2, 0), total 2, plus one each
                             [2 / 6, 2 / 6, 2 / 6],  # from 1: counts (1, 1, 1)
                             [1 / 3, 1 / 3, 1 / 3]],  # 2 never precedes anything
                            dtype=torch.float64)
    bigram = NGramLM(3, order=2, smoothing="add_one").fit(train_ids)  # the baseline is the n-gram family
    torch.testing.assert_close(stateless_log_probs(bigram).exp().double(), expected)
    val_ids = torch.tensor([0, 1, 2, 2])
    score = score_bigram(train_ids, Split(val_ids, torch.tensor([1, 2, 3])))
    assert score.nll_sum == pytest.approx(-(math.log(3 / 5) + math.log(2 / 6) + math.log(1 / 3)))
    assert (score.tokens, score.characters) == (3, 2 + 3 + 3)


def test_tables_score_uneven_token_lengths():
    table = torch.log_softmax(torch.randn(4, 4, dtype=torch.float64), -1)
    ids = torch.tensor([3, 0, 2, 2, 1])
    score = score_table(table, Split(ids, torch.tensor([1, 2, 5, 1])))
    assert score.nll_sum == pytest.approx(-(table[3, 0] + table[0, 2] + table[2, 2] + table[2, 1]).item())
    assert score.characters == 1 + 5 + 5 + 2  # the targets 0, 2, 2, 1


@pytest.mark.parametrize("stride", [1, 3])
def test_one_pass_of_windows_scores_every_shorter_context(model, ids, stride):
    window = 6
    scores = score_contexts(model, split(ids), window, [1, 2, 4, 6], stride=stride)
    for w, score in scores.items():
        # Context w: the targets u = w + 1 - window (mod stride), each from its own last w tokens.
        targets = [u for u in range(1, ids.numel()) if (u - (w + 1 - window)) % stride == 0]
        nlls = [nll_of(model, ids[max(0, u - w):u], ids[u].item()) for u in targets]
        check_score(score, nlls, ids[targets])
        if stride == 1:
            assert score.nll_sum == pytest.approx(score_windowed(model, split(ids), w).nll_sum, rel=1e-9)
    assert scores[6].exact == (stride == 1) and scores[6].population == ids.numel() - 1


def test_context_curve_points_exact_or_on_a_systematic_sample(model, ids):
    """Exact, every point is the windowed figure at its context; within a budget, the points share the
    windowed pass's stride, each the same targets as score_contexts at that stride, with its error."""
    up_to = lambda seq_len: curve_lengths(None, seq_len, None, 10**6)[0]  # noqa: E731
    assert up_to(128) == [1, 2, 4, 8, 16, 32, 64, 128] and up_to(12) == [1, 2, 4, 8, 12]
    settings = OmegaConf.create({"budget": None, "streams": 1, "curve_longest": None})
    exact = run_plan(model, ids, split(ids), plan_of(model, 149, 6, settings, None)).curve
    for w in [1, 2, 4, 6]:
        assert exact[str(w)] == pytest.approx(score_windowed(model, split(ids), w).bpc, rel=1e-9)
        assert exact["settings"]["targets"][str(w)] == 149 and exact["settings"]["bpc_se"][str(w)] == 0
    assert exact["1"] == pytest.approx(score_stateless(model, split(ids)).bpc, abs=1e-4)
    assert exact["stateful"] == score_stateful(model, split(ids), 6, 1).bpc
    plan = plan_evaluation(model, 149, seq_len=6, window=6, streams=1, budget=200)
    stride = plan.passes[plan.figure("windowed").passes[0]].stride
    sampled = run_plan(model, ids, split(ids), plan).curve
    assert stride > 1 and set(sampled["settings"]["stride"].values()) == {stride, 1}
    for w in [1, 2, 4, 6]:
        assert sampled[str(w)] == pytest.approx(score_contexts(model, split(ids), 6, [w], stride)[w].bpc, rel=1e-9)
        assert sampled["settings"]["bpc_se"][str(w)] > 0
    assert sampled["settings"]["targets"]["6"] == len(range(1, 150, stride))


def test_standard_error_of_a_sample_is_the_ratio_estimators():
    nll = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=torch.float64)
    chars = torch.tensor([1, 2, 1, 3, 1])
    score = Score(nll.sum().item(), 5, int(chars.sum()), ((nll * nll).sum().item(), (nll * chars).sum().item(),
                                                          (chars * chars).sum().item()))
    ratio = nll.sum() / chars.sum()
    expected = (math.sqrt(((nll - ratio * chars) ** 2).sum().item() / (5 * 4)) / (chars.float().mean().item())
                / math.log(2))
    assert score.bpc_se == pytest.approx(expected)


def test_eval_mode_restores_the_mode_also_on_error(model):
    model.train()
    with pytest.raises(RuntimeError):
        with eval_mode(model):
            assert not model.training
            raise RuntimeError("boom")
    assert model.training
    model.eval()
    with eval_mode(model):
        pass
    assert not model.training


def test_briefly_trained_gru_is_better_stateful_than_stateless(shakespeare):
    """The study's claim on an Astra-alpha-sized GRU after 30 short steps on Tiny Shakespeare."""
    train_text, val_text = split_text(shakespeare.read_text(encoding="utf-8"), 0.9)
    tokenizer = CharTokenizer.from_text(train_text)
    train_ids = torch.tensor(tokenizer.encode(train_text))
    val_ids = torch.tensor(tokenizer.encode(val_text))[:20_000]
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=64, hidden_size=128, num_layers=1, dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for inputs, targets in RandomWindowBatches(train_ids, 32, 32, 30, torch.Generator().manual_seed(0)):
        logits, _ = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # 30 steps of 32 x 32 tokens; budget 2: 61,440 forward tokens, the stateful pass's 20,000 exact and
    # the rest for the windows of 32 and the curve (a sample of them).
    settings = OmegaConf.create({"streams": 16, "window": 32, "budget": 2.0, "curve_longest": None})
    plan = plan_of(model, 19_999, 32, settings, training_tokens=30 * 32 * 32)
    evaluation = run_plan(model, train_ids, Split.of(val_ids, tokenizer), plan)
    bpc = {mode: score.bpc for mode, score in evaluation.scores.items()}
    assert bpc["stateful"] < bpc["stateless"] - 0.3, bpc
    assert bpc["windowed"] < bpc["stateless"] - 0.3, bpc
    # A stateless GRU is a first-order model, so it cannot beat the best first-order table by much;
    # the stateful one has already left the bigram table behind.
    assert bpc["stateful"] < bpc["bigram"], bpc
    # The context curve: one token of context is the stateless model; more context helps.
    curve = evaluation.curve
    assert [key for key, _ in curve_points(curve)] == ["1", "2", "4", "8", "16", "32", "stateful"]
    assert abs(curve["1"] - bpc["stateless"]) < 4 * curve["settings"]["bpc_se"]["1"]  # a sample of it
    assert curve["8"] < curve["1"] - 0.3 and curve["stateful"] == bpc["stateful"]
    # Every k-th target for the windowed figure and every point its windows give; the training window
    # (32) is the windowed figure.
    k = plan.passes[plan.figure("windowed").passes[0]].stride
    assert evaluation.scores["stateful"].exact and k > 1
    assert curve["settings"]["stride"]["16"] == k and curve["settings"]["targets"]["32"] == len(range(1, 20_000, k))
    assert curve["settings"]["bpc_se"]["32"] > 0 and curve["32"] == bpc["windowed"]


@pytest.mark.slow
def test_training_writes_the_four_figures_and_the_side_by_side_samples(compose_config, small_shakespeare):
    cfg = compose_config(f"data.path={small_shakespeare}", "data.batch_size=4", "data.seq_len=16",
                         "trainer.max_steps=3", "model.steps_per_epoch=3", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu",
                         "evaluation.budget=null", "evaluation.samples.chars=40", "evaluation.text.samples=4",
                         "evaluation.text.chars=60", "evaluation.text.drift_chars=500")
    summary = train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for mode in ["stateful", "stateless", "windowed", "bigram"]:
        for unit in ["nll", "bpc"]:
            assert math.isfinite(on_disk[f"{mode}_{unit}"]) and on_disk[f"{mode}_{unit}"] == summary[f"{mode}_{unit}"]
    assert on_disk["mode_evaluation"]["window"] == 16 and on_disk["mode_evaluation"]["windowed_stride"] == 1
    # The context curve: the point "1" is the stateless figure computed another way.
    curve = on_disk["context_curve"]
    # Past the training window (16) the curve doubles up to evaluation.curve_longest (1024).
    assert [key for key, _ in curve_points(curve)] == ["1", "2", "4", "8", "16", "32", "64", "128", "256", "512",
                                                       "1024", "stateful"]
    assert curve["settings"]["longest"] == 1024
    assert curve["1"] == pytest.approx(on_disk["stateless_bpc"], abs=1e-4)
    assert curve["16"] == pytest.approx(on_disk["windowed_bpc"]) and curve["stateful"] == on_disk["stateful_bpc"]
    # The best checkpoint beside the final weights; history.csv has the modes at every validation.
    best = on_disk["best"]
    assert best["step"] <= on_disk["train_steps"] and best["same_as_final"] == (best["step"] == on_disk["train_steps"])
    history = read_history(run_dir / "history.csv")
    assert [step for step, _ in history["val/stateful_bpc"]] == [step for step, _ in history["val/loss"]]
    assert history["val/stateful_bpc"][-1][1] == pytest.approx(on_disk["stateful_bpc"], rel=1e-5)
    assert history["val/stateless_bpc"][-1][1] == pytest.approx(on_disk["stateless_bpc"], rel=1e-5)

    # A best checkpoint from another step is loaded and scored in every mode: here the final
    # weights recorded as step 1, so its figures must be the final ones.
    checkpoint = torch.load(on_disk["checkpoint"], weights_only=True)
    checkpoint["global_step"] = 1
    torch.save(checkpoint, run_dir / "checkpoints" / "earlier.ckpt")
    earlier = dict(on_disk, best_checkpoint=str(run_dir / "checkpoints" / "earlier.ckpt"))
    train_text, val_text = split_text(small_shakespeare.read_text(encoding="utf-8"), cfg.data.train_fraction)
    tokenizer = CharTokenizer.from_text(train_text)
    val = Split.of(torch.tensor(tokenizer.encode(val_text)), tokenizer)
    trained = load(Path(on_disk["checkpoint"]), "cpu")  # the run's final weights, as the end of training holds them
    best = score_best(trained, earlier, val, EvaluationSettings.of(cfg.evaluation, cfg.data.seq_len),
                      train_ids=torch.tensor(tokenizer.encode(train_text)), eval_batch_size=cfg.data.eval_batch_size)
    assert best["step"] == 1 and not best["same_as_final"]
    for key in ["val_loss", "val_bpc", "stateful_bpc", "stateless_bpc", "windowed_bpc", "windowed_nll"]:
        assert best[key] == pytest.approx(on_disk[key], rel=1e-5), key

    # The bigram baseline is the training split's counts, scored on the validation split.
    train_text, val_text = split_text(small_shakespeare.read_text(encoding="utf-8"), cfg.data.train_fraction)
    vocab = sorted(set(train_text))
    pairs, firsts = Counter(zip(train_text, train_text[1:])), Counter(train_text[:-1])
    nll = -sum(math.log((pairs[a, b] + 1) / (firsts[a] + len(vocab))) for a, b in zip(val_text, val_text[1:]))
    assert on_disk["bigram_nll"] == pytest.approx(nll / (len(val_text) - 1), rel=1e-9)
    assert on_disk["bigram_bpc"] == pytest.approx(nll / math.log(2) / (len(val_text) - 1), rel=1e-9)

    samples = json.loads((run_dir / "samples.json").read_text())
    assert set(samples) == {"prompts", "stateful", "stateless", "settings", "text"}
    # The text statistics recompute from the texts samples.json keeps (budget null: all of them, the drift too)
    index, texts = TrainingIndex(train_text), samples["text"]
    for mode, by_decoder in on_disk["text"]["modes"].items():
        assert set(by_decoder) == set(DECODERS)
        for decoder, figures in by_decoder.items():
            assert len(texts[mode][decoder]) == 4 and all(len(text) >= 40 for text in texts[mode][decoder])
            assert figures == text_statistics(texts[mode][decoder], index, texts["reference"]), (mode, decoder)
    assert on_disk["text"]["reference"] == text_statistics(texts["reference"], index, texts["other_reference"])
    assert [len(stretches) for stretches in on_disk["text"]["drift"].values()] == [1, 1]
    assert [step for step, _ in history["val/stateful_word_validity"]] == [step for step, _ in history["val/loss"]]
    assert 0 <= history["val/stateless_word_validity"][-1][1] <= 1
    # The curve by kind of target: the four classes share the split's targets.
    by_class = curve["by_class"]
    assert sum(by_class[name]["targets"] for name in CLASSES) == len(val_text) - 1
    assert samples["prompts"] == ["ROMEO: ", "KING: ", "FIRST CITIZEN: "]
    assert samples["settings"]["seed"] == cfg.seed and samples["settings"]["max_new_tokens"] == 40
    for mode in ["stateful", "stateless"]:
        assert [len(text) for text in samples[mode]] == [len(p) + 40 for p in samples["prompts"]]
        assert all(text.startswith(prompt) for text, prompt in zip(samples[mode], samples["prompts"]))


# --- evaluation.budget and the progress bars ---------------------------------------------------

def _settings(budget=None):
    return OmegaConf.create({"streams": 4, "window": None, "budget": budget, "curve_longest": None})


def test_a_budget_scores_a_systematic_sample_with_its_standard_error(model):
    """Within a budget the windowed mode and every curve point score every k-th target (the same targets
    as score_contexts at stride k), with a standard error; stateful, stateless and bigram stay whole;
    null scores everything, exactly."""
    ids = torch.randint(V, (400,), generator=torch.Generator().manual_seed(3))
    val, train_ids = Split(ids, lengths()), ids.flip(0)
    whole = run_plan(model, train_ids, val, plan_of(model, 399, 8, _settings(), training_tokens=1000))
    assert whole.settings["windowed_targets"] == 399 and whole.settings["windowed_bpc_se"] == 0.0
    assert whole.plan.exact and "whole validation split" in whole.describe()

    sampled = run_plan(model, train_ids, val, plan_of(model, 399, 8, _settings(budget=0.4), training_tokens=1000))
    k = sampled.settings["windowed_stride"]
    assert k > 1 and sampled.settings["windowed_targets"] == len(range(1, 400, k))
    assert sampled.scores["windowed"].nll == pytest.approx(score_contexts(model, val, 8, [8], k)[8].nll, rel=1e-12)
    assert 0 < sampled.settings["windowed_bpc_se"] < 1
    for key, targets in sampled.curve["settings"]["targets"].items():
        if key != "stateful":
            assert targets < 399 and sampled.curve["settings"]["bpc_se"][key] > 0, key
    for mode in ("stateful", "stateless", "bigram"):  # one pass each: always whole
        assert sampled.scores[mode].tokens == 399 and sampled.scores[mode].nll == whole.scores[mode].nll
    assert not sampled.plan.exact and "within evaluation.budget" in sampled.describe()
    # The sample estimates the whole figure within a few standard errors.
    se = sampled.settings["windowed_bpc_se"]
    assert abs(sampled.scores["windowed"].bpc - whole.scores["windowed"].bpc) < 4 * se


def test_the_evaluation_shows_a_bar_per_pass(model, capsys):
    from gru_experiments.study.generation import Progress

    ids = torch.randint(V, (300,), generator=torch.Generator().manual_seed(4))
    plan = plan_of(model, 299, 8, _settings(), None)
    run_plan(model, ids, Split(ids, lengths()), plan, progress=Progress(enabled=True))
    bars = capsys.readouterr().err
    assert "evaluation: stateful" in bars and "evaluation: windows of 8" in bars and "100%" in bars
    run_plan(model, ids, Split(ids, lengths()), plan, progress=Progress(enabled=False))
    assert capsys.readouterr().err == ""


def test_the_budget_is_validated(compose_config, tiny_corpus):
    from gru_experiments.errors import UserError
    from gru_experiments.runs.checks import validate

    assert compose_config().evaluation.budget == 0.6
    for bad in ("0", "-3", "many"):
        with pytest.raises(UserError, match="evaluation.budget"):
            validate(compose_config(f"data.path={tiny_corpus}", f"evaluation.budget={bad}"))


def test_a_smoke_run_writes_strict_json_and_says_why_a_figure_is_missing(compose_config, tiny_corpus, tmp_path):
    """fast_dev_run scores a small slice: stateful - windowed may share too few targets for a standard error,
    which summary.json gave as NaN; now null, with the reason beside it."""
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", "trainer.fast_dev_run=true",
                                   "evaluation.text.samples=0"))
    assert math.isnan(summary["state_gain_se"])  # in memory: no pair of targets to take it from
    run = tmp_path / "run"
    written = {name: strict_json((run / name).read_text()) for name in ("summary.json", "samples.json")}
    assert written["summary.json"]["state_gain_se"] is None and written["summary.json"]["status"] == "completed"
    assert written["summary.json"]["state_gain_note"].startswith("stateful - windowed (32 tokens) not measured: "
                                                                 "paired on 0 target(s)")
