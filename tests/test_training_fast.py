"""runs/training.py's steps without a training (its trainings are test_training.py's and the resume tests', marked
slow): a counted model's parameters logged, a resume of a run that stopped early trained no further, the weights'
divergence passed on as it is, and the record of a run that stopped early; Lightning's fit a stand-in."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
from robustness_helpers import TINY

from gru_experiments.errors import TrainingDiverged
from gru_experiments.runs.checkpoints import NonFiniteWeights
from gru_experiments.runs.checks import validate
from gru_experiments.runs.jobs import Job
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.training import fit_or_count, prepare, write


def test_a_counted_models_parameters_go_to_its_logger(compose_config, tiny_corpus):
    """The n-gram is counted, not trained: its stored numbers are logged once counted (csv here), its last.ckpt
    saved."""
    run = prepare(validate(compose_config(*TINY, "model=ngram", "logger=csv", f"data.path={tiny_corpus}")))
    fit_or_count(run, Job())
    run.logger.save()
    with open(run.logger.log_dir + "/metrics.csv") as f:
        logged = [row["parameters"] for row in csv.DictReader(f) if row["parameters"]]
    assert run.parameters > 0 and logged == [str(run.parameters)]
    assert run.folder.checkpoint.is_file() and run.trainer.global_step == 0


def fitted(monkeypatch, fit) -> list:
    """Lightning's Trainer.fit replaced by `fit(trainer, ckpt_path)`; the trainers it was called on."""
    called = []

    def stand_in(trainer, model, datamodule=None, ckpt_path=None, weights_only=None):
        assert weights_only is True  # every load weights-only (tests/test_run_contents.py)
        called.append((trainer, ckpt_path))
        fit(trainer, ckpt_path)
    monkeypatch.setattr(pl.Trainer, "fit", stand_in)
    return called


def test_a_resume_of_a_run_that_stopped_early_trains_no_further(compose_config, tiny_corpus, tmp_path, monkeypatch,
                                                                 capsys):
    """Stopped early, then cut off in its evaluation: the resume restores the checkpoint with the trainer's limit at
    its step (Lightning trains nothing), and says so."""
    run = prepare(validate(compose_config(*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=10")))
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    run.resume = SimpleNamespace(step=40, stopped_early="val/loss did not improve for 2 validations in a row",
                                 wandb_run_id=None, checkpoint=checkpoint)
    called = fitted(monkeypatch, lambda trainer, ckpt_path: None)
    fit_or_count(run, Job())
    ((trainer, ckpt_path),) = called
    assert trainer is run.trainer and trainer.max_steps == 40 and ckpt_path == checkpoint
    assert (f"{run.folder.path} stopped early at step 40 (val/loss did not improve for 2 validations in a row): not "
            "training on; finishing its evaluation") in capsys.readouterr().out


def test_weights_that_became_non_finite_stop_the_run_with_their_own_message(compose_config, tiny_corpus, monkeypatch):
    """NonFiniteWeights already names the checkpoint kept: passed on unchanged; a diverged loss gets where the last
    good checkpoint is, and the advice."""
    run = prepare(validate(compose_config(*TINY, f"data.path={tiny_corpus}")))

    def diverge(error):
        def fit(trainer, ckpt_path):
            raise error
        return fit
    weights = NonFiniteWeights("training diverged: weights became non-finite (model.head.bias) at step 7; not "
                               "saved, no checkpoint was saved before; try a lower model.lr")
    fitted(monkeypatch, diverge(weights))
    with pytest.raises(NonFiniteWeights) as raised:
        fit_or_count(run, Job())
    assert raised.value is weights
    monkeypatch.undo()
    fitted(monkeypatch, diverge(TrainingDiverged("training diverged: the loss is nan at training step 3 (epoch 0)")))
    with pytest.raises(TrainingDiverged, match=r"^training diverged: the loss is nan at training step 3 \(epoch 0\); "
                                               r"stopped before any checkpoint was saved; try a lower model.lr$"):
        fit_or_count(run, Job())


def test_the_record_of_a_run_that_stopped_early_says_where_and_why(tmp_path, capsys):
    """training.write: summary.json with the whole run's wall time, samples.json, and the lines that end the run."""
    run = SimpleNamespace(folder=RunDir(tmp_path / "run"), logger=False)
    summary = {"model": "astra_alpha", "train_loss": 1.5, "val_loss": 1.25, "val_bpc": 1.8, "train_steps": 1200,
               "tokens_per_second": 52_000.0, "stopped_early": True, "stopped_at_step": 1200,
               "stop_reason": "val/loss did not improve for 2 validations in a row (patience 2)",
               "run_dir": str(tmp_path / "run"), "wall_seconds": None}
    write(run, summary, {"samples": ["To be"]}, SimpleNamespace(seconds=12.3))
    assert json.loads(run.folder.summary_file.read_text()) == {**summary, "wall_seconds": 12.3}
    assert json.loads(run.folder.samples_file.read_text()) == {"samples": ["To be"]}
    assert capsys.readouterr().out.splitlines() == [
        "stopped early at step 1,200: val/loss did not improve for 2 validations in a row (patience 2)",
        f"astra_alpha: train loss 1.5000 | val loss 1.2500 | val bpc 1.8000 | 1,200 steps at 52,000 tokens/s | "
        f"12.3 s | summary: {tmp_path / 'run'}/summary.json"]
