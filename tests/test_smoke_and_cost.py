"""Issue 20: trainer.fast_dev_run is a smoke run of the whole pipeline on a small slice, and a run
states its estimated time (training + validation + evaluation) after its first steps."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from evaluation_helpers import defaults, plan_of
from omegaconf import OmegaConf

from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.runs.trained_run import TrainedRun
from gru_experiments.runs.training import SMOKE_VAL_TOKENS, train
from gru_experiments.runs.training_callbacks import CostEstimate
from gru_experiments.study.cost import describe_estimate
from gru_experiments.study.evaluation import FIGURES, EvaluationSettings
from gru_experiments.study.plan import BEST
from gru_experiments.study.scores import Split


def test_fast_dev_run_runs_the_whole_pipeline_on_a_small_slice(compose_config, small_shakespeare, capsys):
    cfg = compose_config(f"data.path={small_shakespeare}", "trainer.fast_dev_run=true", "trainer.accelerator=cpu")
    summary = train(cfg)
    out = capsys.readouterr().out
    assert "fast_dev_run: a smoke run on a small slice" in out
    on_disk = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert on_disk["smoke"] is True and summary["smoke"] is True
    assert on_disk["train_steps"] == 1 and on_disk["eval_seconds"] > 0
    for figure in FIGURES:
        assert math.isfinite(on_disk[f"{figure}_bpc"]), figure
    # The evaluation's budget is a multiple of the one step trained: windowed and the curve are sampled.
    settings = on_disk["mode_evaluation"]
    assert settings["split_targets"] == SMOKE_VAL_TOKENS - 1 and on_disk["train_tokens"] == 64 * 128
    assert settings["budget"] == math.floor(cfg.evaluation.budget * 64 * 128)
    assert 0 < settings["windowed_targets"] < SMOKE_VAL_TOKENS - 1 and not on_disk["eval_whole_split"]
    assert list(on_disk["context_curve"])[:2] == ["1", "2"] and "stateful" in on_disk["context_curve"]
    samples = json.loads((Path(cfg.paths.output_dir) / "samples.json").read_text())
    assert samples["stateful"] and samples["stateless"]


def test_a_run_that_is_not_a_smoke_run_says_so(compose_config, tiny_corpus, capsys):
    cfg = compose_config(f"data.path={tiny_corpus}", "trainer.max_steps=12", "model.steps_per_epoch=12",
                         "data.batch_size=4", "data.seq_len=16", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.samples.chars=10")
    summary = train(cfg)
    assert summary["smoke"] is False and summary["eval_seconds"] > 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("estimated time left")]
    # Without the progress bar: a line before the evaluation (its forward tokens, what the budget samples), one per pass
    assert f"evaluation: {summary['mode_evaluation']['forward_tokens']:,} forward tokens (modes " in out
    assert "evaluation: stateful, " in out
    # After step 1 (warm-up) and 10 timed steps: one step left, and the evaluation counted.
    assert "training" in line and "(1 steps at" in line and "end-of-run evaluation" in line, line
    # Its forward tokens are those the end-of-run evaluation runs (the final weights' plan; the best checkpoint's
    # only where it is not the final one, said apart)
    counted = int(re.search(r"end-of-run evaluation .*? \(([\d,]+) forward tokens", line).group(1).replace(",", ""))
    assert counted == summary["mode_evaluation"]["forward_tokens"] > 0
    assert "if the best checkpoint is not the final weights" in line


def test_the_estimate_adds_training_validation_and_evaluation():
    class Trainer:
        max_steps, global_step, max_epochs, current_epoch = 1000, 100, 5, 0

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    cfg = _cfg()
    rng = torch.get_rng_state()
    estimate = _estimate(model, cfg).compute(Trainer(), step_seconds=0.5)
    assert torch.equal(torch.get_rng_state(), rng)  # its timing draws nothing: training's dropout masks stay the same
    assert estimate["steps_left"] == 900 and estimate["train_seconds"] == 450
    # The estimate times the very plans the run executes: the final weights', and the best checkpoint's apart.
    final = plan_of(model, 1000, 16, cfg.evaluation, 1000 * 8 * 16)
    best = plan_of(model, 1000, 16, cfg.evaluation, 1000 * 8 * 16, purpose=BEST)
    assert estimate["eval_forward_tokens"] == final.forward_tokens
    assert estimate["best_forward_tokens"] == best.forward_tokens
    assert estimate["eval_seconds"] > 0 and estimate["best_seconds"] > 0
    assert estimate["total_seconds"] == pytest.approx(
        estimate["train_seconds"] + estimate["validation_seconds"] + estimate["eval_seconds"])
    assert "estimated time left" in describe_estimate(estimate)


def test_the_estimate_counts_the_validations_that_max_steps_leaves():
    """max_steps=200 of a 20 x 400-step recipe: one validation left, not twenty."""
    class Trainer:
        max_steps, global_step, max_epochs, current_epoch, num_training_batches = 200, 10, 20, 0, 400

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    one = _estimate(model, _cfg()).compute(Trainer(), step_seconds=0.5)
    Trainer.max_steps = 8000
    twenty = _estimate(model, _cfg()).compute(Trainer(), step_seconds=0.5)
    assert twenty["validation_seconds"] == pytest.approx(20 * one["validation_seconds"])


def test_the_modes_are_scored_at_each_validation_but_lightnings_sanity_check():
    """runs/training_callbacks.ModesOverTraining, the trainer and the module stand-ins: nothing logged in the sanity
    check; at a validation the stateful and stateless bpc, the stateless one the exact figure."""
    from types import SimpleNamespace

    from conftest import make_text

    from gru_experiments.data.tokenizers import CharTokenizer
    from gru_experiments.runs.training_callbacks import ModesOverTraining
    from gru_experiments.study.scores import score_stateless

    text = make_text(3000)
    tokenizer = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    model = RecurrentLM(tokenizer.vocab_size, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    val = Split.of(torch.tensor(tokenizer.encode(text[2000:])), tokenizer)
    callback = ModesOverTraining(TrainedRun(model, tokenizer, "model"), val, 8 * 16 * 400, _settings(_cfg()),
                                 text[:2000])
    logged = {}
    module = SimpleNamespace(log=lambda name, value: logged.update({name: value}))
    callback.on_validation_epoch_end(SimpleNamespace(sanity_checking=True), module)
    assert logged == {}
    callback.on_validation_epoch_end(SimpleNamespace(sanity_checking=False), module)
    assert set(logged) == {"val/stateful_bpc", "val/stateless_bpc"} and math.isfinite(logged["val/stateful_bpc"])
    assert logged["val/stateless_bpc"] == pytest.approx(score_stateless(model, val).bpc)


def _val():
    return Split(torch.zeros(1001, dtype=torch.long), torch.ones(11, dtype=torch.long))


def _settings(cfg):
    return EvaluationSettings.of(cfg.evaluation, cfg.data.seq_len)


def _estimate(model, cfg) -> CostEstimate:
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    return CostEstimate(TrainedRun(model, None, "model"), _val(), _settings(cfg), tokens_per_step=tokens_per_step,
                        epoch_tokens=cfg.model.steps_per_epoch * tokens_per_step)


def _cfg():
    return OmegaConf.create({"data": {"seq_len": 16, "batch_size": 8}, "model": {"steps_per_epoch": 400},
                             "evaluation": defaults() | {"streams": 4, "budget": 0.01, "curve_longest": 64}})


def test_the_estimate_counts_the_cache_which_reads_the_stateful_pass_without_forward_tokens():
    from gru_experiments.study.cost import EvaluationClock

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    cfg = _cfg()
    clock = EvaluationClock.of(model, 16)
    final = plan_of(model, 5000, 16, cfg.evaluation, 1000 * 8 * 16)
    best = plan_of(model, 5000, 16, cfg.evaluation, 1000 * 8 * 16, purpose=BEST)
    assert clock.cache_seconds(final) > 0 and clock.cache_seconds(best) == 0  # only the final weights' has one
    assert clock.plan_seconds(final) == pytest.approx(sum(map(clock.pass_seconds, final.passes))
                                                      + clock.cache_seconds(final))
