"""Issue 20: trainer.fast_dev_run is a smoke run of the whole pipeline on a small slice, and a run
states its estimated time (training + validation + evaluation) after its first steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from gru_experiments.runs.estimate import CostEstimate, planned_forward_tokens
from gru_experiments.study.evaluation import FIGURES, evaluate
from gru_experiments.study.scores import Split
from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.models.transformer import TransformerLM
from gru_experiments.runs.smoke import SMOKE, SMOKE_VAL_TOKENS, smoke_config
from gru_experiments.runs.training import train


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
    settings = on_disk["mode_evaluation"]
    assert settings["split_targets"] == SMOKE_VAL_TOKENS - 1 and settings["max_tokens"] == SMOKE["evaluation.max_tokens"]
    assert 0 < settings["windowed_targets"] <= SMOKE["evaluation.max_tokens"] and not on_disk["eval_whole_split"]
    assert list(on_disk["context_curve"])[:2] == ["1", "2"] and "stateful" in on_disk["context_curve"]
    samples = json.loads((Path(cfg.paths.output_dir) / "samples.json").read_text())
    assert samples["stateful"] and samples["stateless"]
    # The command line's smaller values stay; a normal run's config is not touched.
    smaller = smoke_config(compose_config("trainer.fast_dev_run=true", "data.batch_size=2", "evaluation.max_tokens=8"))
    assert smaller.data.batch_size == 2 and smaller.evaluation.max_tokens == 8 and smaller.data.eval_batch_size == 8
    normal = compose_config()
    assert smoke_config(normal) is normal


def test_a_run_that_is_not_a_smoke_run_says_so(compose_config, tiny_corpus, capsys):
    cfg = compose_config(f"data.path={tiny_corpus}", "trainer.max_steps=12", "model.steps_per_epoch=12",
                         "data.batch_size=4", "data.seq_len=16", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu", "evaluation.sample_chars=10")
    summary = train(cfg)
    assert summary["smoke"] is False and summary["eval_seconds"] > 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimated time left")]
    # After step 1 (warm-up) and 10 timed steps: one step left, and the evaluation counted.
    assert "training" in line and "(1 steps at" in line and "end-of-run evaluation" in line, line


@pytest.mark.parametrize("family", ["gru", "transformer"])
@pytest.mark.parametrize("max_tokens", [None, 30])
def test_the_planned_forward_tokens_are_those_the_evaluation_runs(max_tokens, family):
    """planned_forward_tokens (the estimate's evaluation cost) against the tokens evaluate() really
    runs through the model, counted at its forward (the transformer's: at its blocks, where a window
    per prediction runs past its block)."""
    torch.manual_seed(0)
    if family == "gru":
        model, counted_at = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1).eval(), "forward"
    else:
        model = TransformerLM(11, block_size=16, embedding_dim=8, num_layers=1, num_heads=2).eval()
        counted_at = "hidden"
    # 4 streams of 375 tokens: their cold starts (cheaper for the transformer) stay a small part
    ids = torch.randint(11, (1500,), generator=torch.Generator().manual_seed(1))
    settings = OmegaConf.create({"streams": 4, "window": None, "windowed_stride": "auto", "max_tokens": max_tokens,
                                 "curve_point_tokens": 2000, "batch_tokens": 256, "curve_longest": 64,
                                 "long_point_tokens": 4000})
    counted = []
    method = getattr(model, counted_at)
    setattr(model, counted_at, lambda tokens, *state: (counted.append(tokens.numel()), method(tokens, *state))[1])
    evaluate(model, ids, Split(ids, torch.ones(11, dtype=torch.long)), 16, settings, training_tokens=10_000)
    planned = planned_forward_tokens(model, 1499, 16, settings, 10_000, best=False)
    ran = sum(counted) - 11  # the stateless table's one pass over the vocabulary is not counted
    assert abs(planned - ran) <= 0.1 * ran, (planned, ran)


def test_the_estimate_adds_training_validation_and_evaluation():
    class Trainer:
        max_steps, global_step, max_epochs, current_epoch = 1000, 100, 5, 0

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    settings = OmegaConf.create({"streams": 4, "windowed_stride": "auto", "max_tokens": 100, "curve_point_tokens": None})
    estimate = CostEstimate(1000, 16, 8, settings, model=model).compute(Trainer(), step_seconds=0.5)
    assert estimate["steps_left"] == 900 and estimate["train_seconds"] == 450
    assert estimate["eval_forward_tokens"] == planned_forward_tokens(model, 1000, 16, settings, 1000 * 8 * 16)
    assert estimate["total_seconds"] == pytest.approx(
        estimate["train_seconds"] + estimate["validation_seconds"] + estimate["eval_seconds"])
    assert "estimated time left" in CostEstimate.describe(estimate)


def test_the_estimate_counts_the_validations_that_max_steps_leaves():
    """max_steps=200 of a 20 x 400-step recipe: one validation left, not twenty."""
    class Trainer:
        max_steps, global_step, max_epochs, current_epoch, num_training_batches = 200, 10, 20, 0, 400

    model = RecurrentLM(11, "gru", embedding_dim=5, hidden_size=8, num_layers=1)
    settings = OmegaConf.create({"streams": 4, "windowed_stride": "auto", "max_tokens": 100, "curve_point_tokens": None})
    one = CostEstimate(1000, 16, 8, settings, model=model).compute(Trainer(), step_seconds=0.5)
    Trainer.max_steps = 8000
    twenty = CostEstimate(1000, 16, 8, settings, model=model).compute(Trainer(), step_seconds=0.5)
    assert twenty["validation_seconds"] == pytest.approx(20 * one["validation_seconds"])
