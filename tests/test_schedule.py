"""The learning-rate schedule spans the training actually configured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import MODELS
from robustness_helpers import TINY

from gru_experiments.runs.recipe import Recipe, recipe_length
from gru_experiments.runs.task import LanguageModelTask
from gru_experiments.runs.training import train

ON_TRAIN_BATCH_END = LanguageModelTask.on_train_batch_end


def fake_trainer(total_steps: int, per_epoch: int) -> SimpleNamespace:
    return SimpleNamespace(estimated_stepping_batches=total_steps, num_training_batches=per_epoch,
                           accumulate_grad_batches=1)


def optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def learning_rates(opt, schedule, updates: int) -> list[float]:
    """The learning rate before each of `updates` steps, and after the last."""
    rates = []
    for _ in range(updates + 1):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    return rates


@pytest.mark.parametrize("name", MODELS)
def test_full_recipe_schedule_is_bit_identical_to_the_studys(compose_config, name):
    """A full run (the model's epochs, no max_steps) gets exactly the study's schedule: torch's
    CosineAnnealingLR over the epochs, stepped once per epoch."""
    cfg = compose_config(f"model={name}")
    assert cfg.trainer.max_steps == -1 and recipe_length(cfg) == (cfg.model.epochs, cfg.model.steps_per_epoch)
    epochs, per_epoch = cfg.model.epochs, cfg.model.steps_per_epoch
    opt = optimizer(cfg.model.lr)
    schedule = Recipe.from_config(cfg.optim).schedule(opt, fake_trainer(epochs * per_epoch, per_epoch))
    assert schedule.interval == "epoch" and schedule.T_max == epochs
    reference_opt = optimizer(cfg.model.lr)
    reference = torch.optim.lr_scheduler.CosineAnnealingLR(reference_opt, T_max=epochs)
    assert learning_rates(opt, schedule, epochs) == learning_rates(reference_opt, reference, epochs)  # bit for bit


def test_a_step_count_gets_a_schedule_in_steps():
    opt = optimizer(3e-3)
    schedule = Recipe("seed").schedule(opt, fake_trainer(300, 200))  # max_steps=300: 1.5 epochs
    assert schedule.interval == "step" and schedule.T_max == 300
    rates = learning_rates(opt, schedule, 300)
    assert rates[0] == 3e-3 and rates[150] == pytest.approx(1.5e-3) and rates[-1] == 0.0
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_a_300_step_run_ends_with_the_learning_rate_at_the_floor(compose_config, tiny_corpus, monkeypatch):
    """trainer.max_steps=300 of a 10-epoch x 200-step recipe: the schedule reaches its floor (0)
    at the end of the run, not near its peak as a schedule over the recipe's epochs would."""
    used, final = [], {}
    original = LanguageModelTask.training_step

    def training_step(self, batch, batch_idx):
        used.append(self.optimizers().param_groups[0]["lr"])
        return original(self, batch, batch_idx)

    def on_train_end(self):
        final["lr"] = self.optimizers().param_groups[0]["lr"]

    monkeypatch.setattr(LanguageModelTask, "training_step", training_step)
    monkeypatch.setattr(LanguageModelTask, "on_train_end", on_train_end)
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "data.batch_size=2", "data.seq_len=8",
                         "model.architecture.hidden_size=16", "model.architecture.embedding_dim=8",
                         "trainer.max_steps=300", "model.epochs=10", "model.steps_per_epoch=200",
                         "checkpoint.every_n_steps=0")
    summary = train(cfg)
    assert summary["train_steps"] == 300 and len(used) == 300
    assert used[0] == cfg.model.lr and final["lr"] == 0.0  # the floor
    assert used[-1] < 1e-6  # the last steps already train at almost nothing
    assert all(a >= b for a, b in zip(used, used[1:]))


@pytest.mark.slow  # more than ~3 s on the 2-core CPU (pyproject's marker)
def test_a_resumed_step_schedule_continues_where_it_was(compose_config, tiny_corpus, tmp_path, monkeypatch):
    """trainer.max_steps=13 of 2 epochs x 8 steps (a schedule in steps), interrupted after step 11,
    resumed from the checkpoint of step 9: the same learning rates and results as in one go."""
    from test_resume import Interrupted, interrupt_at, summary_of, weights_of

    base = [*TINY, f"data.path={tiny_corpus}", "data.seq_len=16", "model.steps_per_epoch=8", "model.epochs=2",
            "trainer.max_steps=13", "checkpoint.every_n_steps=3"]
    rates = []
    original = LanguageModelTask.training_step
    monkeypatch.setattr(LanguageModelTask, "training_step", lambda self, batch, i: rates.append(
        (self.global_step, self.optimizers().param_groups[0]["lr"])) or original(self, batch, i))
    uninterrupted = tmp_path / "uninterrupted"
    train(compose_config(*base, f"paths.output_dir={uninterrupted}"))
    in_one_go, rates[:] = dict(rates), []

    interrupt_at(monkeypatch, 11)
    with pytest.raises(Interrupted):
        train(compose_config(*base))
    monkeypatch.setattr(LanguageModelTask, "on_train_batch_end", ON_TRAIN_BATCH_END)  # no more interruptions
    rates[:] = []
    summary = train(compose_config(*base, f"resume={tmp_path / 'run'}"))
    assert summary["train_steps"] == 13 and summary["resumed_from_step"] == 9
    assert dict(rates) == {step: in_one_go[step] for step in range(9, 13)}  # bit for bit
    assert in_one_go[12] < in_one_go[0] / 50  # near the floor at the end
    resumed, reference = summary_of(tmp_path / "run"), summary_of(uninterrupted)
    for key in ("train_loss", "val_loss", "stateful_nll", "stateless_nll"):
        assert resumed[key] == reference[key], key
    a, b = weights_of(tmp_path / "run"), weights_of(uninterrupted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

