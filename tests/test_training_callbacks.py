"""The training's callbacks (runs/training_callbacks.py) with stand-ins for the trainer: the cost estimate
(CostEstimate) adds training, validation and evaluation, timing the very plans the run executes, and counts
the validations max_steps leaves; the modes are scored at each validation but Lightning's sanity check
(ModesOverTraining)."""

from __future__ import annotations

import math

import pytest
import torch
from evaluation_helpers import _cfg, plan_of

from gru_experiments.models.recurrent import RecurrentLM
from gru_experiments.runs.trained_run import TrainedRun
from gru_experiments.runs.training_callbacks import CostEstimate
from gru_experiments.study.cost import describe_estimate
from gru_experiments.study.evaluation import EvaluationSettings
from gru_experiments.study.plan import BEST
from gru_experiments.study.scores import Split


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
