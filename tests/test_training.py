"""The training (runs/training.py). Real training runs: the model learns, checkpoints rebuild it, W&B stays offline,
multirun jobs stay apart; trainer.fast_dev_run is a smoke run of the whole pipeline on a small slice; what a run says
up front; a diverging run stops in one line, keeps its last good checkpoint and says so in summary.json. And its steps
without a training, Lightning's fit a stand-in: a counted model's parameters logged, a resume of a run that stopped
early trained no further, the weights' divergence passed on as it is, and the record of a run that stopped early."""

import csv
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from conftest import REPO
from robustness_helpers import TINY, fail_in_process, train
from wandb_records import offline_runs

from gru_experiments.data.corpus import read_corpus, split_text
from gru_experiments.errors import TrainingDiverged
from gru_experiments.runs.checkpoints import NonFiniteWeights, read_checkpoint
from gru_experiments.runs.checks import validate
from gru_experiments.runs.jobs import Job
from gru_experiments.runs.run_dir import RunDir
from gru_experiments.runs.task import LanguageModelTask, load_checkpoint
from gru_experiments.runs.training import SMOKE_VAL_TOKENS, fit_or_count, prepare, write
from gru_experiments.study.evaluation import FIGURES


def unigram_entropy_nats(text: str) -> float:
    counts = Counter(text)
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


@pytest.mark.slow
def test_short_astra_alpha_run_learns_well_below_unigram_entropy(compose_config, shakespeare, capsys):
    # The last 1% validates (11k characters): the end-of-run evaluation stays a few seconds.
    cfg = compose_config(f"data.path={shakespeare}", "trainer.max_steps=300", "model.steps_per_epoch=150",
                         "data.batch_size=32", "data.seq_len=64", "data.train_fraction=0.99",
                         "trainer.enable_progress_bar=false", "trainer.accelerator=cpu")
    summary = train(cfg)
    assert "trainable parameters: 86,913" in capsys.readouterr().out

    _, val_text = split_text(read_corpus(shakespeare), 0.99)
    entropy = unigram_entropy_nats(val_text)  # ~3.3 nats: what a model with no context could reach
    assert summary["val_loss"] < entropy - 0.8, (summary["val_loss"], entropy)
    assert summary["val_bpc"] == pytest.approx(summary["val_loss"] / math.log(2))  # char: one token, one char
    assert summary["train_steps"] == 300 and summary["tokens_per_second"] > 0

    # The checkpoint alone rebuilds model and tokenizer and reproduces the logits.
    task = load_checkpoint(summary["checkpoint"])
    assert task.tokenizer.vocab_size == summary["vocab_size"] == 65
    tokens = torch.tensor([task.tokenizer.encode("ROMEO: ")])
    again = load_checkpoint(summary["checkpoint"])
    torch.testing.assert_close(task.model(tokens)[0], again.model(tokens)[0])
    assert Path(summary["best_checkpoint"]).is_file()


def test_wandb_offline_without_login_writes_into_the_run_folder(compose_config, tiny_corpus, tmp_path, monkeypatch):
    for var in ["WANDB_MODE", "WANDB_API_KEY"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.chdir(tmp_path)
    cfg = compose_config("logger=wandb", f"data.path={tiny_corpus}", "data.batch_size=4", "data.seq_len=16",
                         "trainer.max_steps=4", "model.steps_per_epoch=2", "trainer.enable_progress_bar=false",
                         "trainer.accelerator=cpu")
    summary = train(cfg)
    (logged,) = offline_runs(cfg.paths.output_dir)
    assert not (tmp_path / "wandb").exists()  # nothing in the current directory
    assert logged.summary["val_loss"] == pytest.approx(summary["val_loss"])
    assert logged.summary["parameters"] == summary["parameters"]
    assert logged.series("val/loss") and logged.exit_code == 0
    # The resolved config, as plain nested values.
    assert logged.config["model"]["architecture"]["embedding_dim"] == 64
    assert logged.config["paths"]["output_dir"] == cfg.paths.output_dir


@pytest.mark.slow
def test_multirun_jobs_get_their_own_folders(shakespeare, tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline", "PROJECT_ROOT": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "model=astra_alpha,scribe_alpha", f"data.path={shakespeare}",
         "data.batch_size=4", "data.seq_len=32", "trainer.max_steps=2",
         "model.steps_per_epoch=2", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
         f"hydra.sweep.dir={sweep_dir}"],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = sorted(sweep_dir.glob("*/summary.json"))
    assert [p.parent.name for p in summaries] == ["0_astra_alpha", "1_scribe_alpha"]
    assert [json.loads(p.read_text())["tokenizer"] for p in summaries] == ["char", "spm"]
    # One W&B run per job, each in its own job folder.
    assert all(len(list((p.parent / "wandb").glob("offline-run-*"))) == 1 for p in summaries)


def test_a_diverging_run_stops_with_one_line_and_says_so_in_summary_json(compose_config, tiny_corpus, tmp_path,
                                                                         capsys):
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "model.lr=1e6", "trainer.max_steps=30",
                         "checkpoint.every_n_steps=1")
    line = fail_in_process(capsys, cfg)
    assert line.startswith("error: training diverged: the loss is ")
    assert "above 4 x ln 54 = 16.0 nats" in line and line.endswith("try a lower model.lr")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("TrainingDiverged: training diverged")


def test_a_warmup_longer_than_the_run_and_an_exact_evaluation_say_so_up_front(compose_config, tiny_corpus, capsys):
    train(compose_config(*TINY, f"data.path={tiny_corpus}", "trainer.max_steps=2", "optim.warmup_steps=50",
                         "evaluation.budget=null", "evaluation.text.samples=0", "evaluation.curve_longest=null"))
    out = capsys.readouterr().out
    assert ("optim.warmup_steps=50 is not shorter than this run's 2 steps: the learning rate never leaves its warmup "
            "(it ends at 3.9% of model.lr)") in out
    exact = next(line for line in out.splitlines() if line.startswith("evaluation: ") and "exact" in line)
    assert out.index(exact) < out.index("evaluation of the final weights")  # before the work, not after
    assert re.fullmatch(r"evaluation: [\d,]+ forward tokens \(.+; [\d,.]+ per token trained\), every figure exact "
                        r"\(evaluation.budget=null\)", exact)


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(compose_config, tiny_corpus, tmp_path,
                                                                            monkeypatch, capsys):
    original = LanguageModelTask.on_train_batch_end

    def poison_after_step_3(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == 3:  # after step 3's checkpoint was written
            with torch.no_grad():
                self.model.head.weight.fill_(float("nan"))

    monkeypatch.setattr(LanguageModelTask, "on_train_batch_end", poison_after_step_3)
    cfg = compose_config(*TINY, f"data.path={tiny_corpus}", "model.steps_per_epoch=10", "model.epochs=1",
                         "checkpoint.every_n_steps=1")
    line = fail_in_process(capsys, cfg)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert line == (f"error: training diverged: the loss is nan at training step 4 (epoch 0); stopped, the last good "
                    f"checkpoint is kept: {last} (step 3); try a lower model.lr")
    checkpoint = read_checkpoint(last)
    assert checkpoint["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())  # the run says it diverged
    assert summary["status"] == "failed" and summary["error"] == "TrainingDiverged: " + line.removeprefix("error: ")


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


def test_a_counted_models_parameters_go_to_its_logger(compose_config, tiny_corpus):
    """The n-gram is counted, not trained: its stored numbers are logged once counted (csv here), its last.ckpt
    saved."""
    run = prepare(validate(compose_config(*TINY, "model=ngram", "logger=csv", f"data.path={tiny_corpus}")))
    fitted = fit_or_count(run, Job())
    fitted.logger.save()
    with open(fitted.logger.log_dir + "/metrics.csv") as f:
        logged = [row["parameters"] for row in csv.DictReader(f) if row["parameters"]]
    assert fitted.parameters > 0 and logged == [str(fitted.parameters)]
    assert run.folder.checkpoint.is_file() and fitted.trainer.global_step == 0


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
    run = replace(run, resume=SimpleNamespace(step=40, wandb_run_id=None, checkpoint=checkpoint,
                                              stopped_early="val/loss did not improve for 2 validations in a row"))
    called = fitted(monkeypatch, lambda trainer, ckpt_path: None)
    result = fit_or_count(run, Job())
    ((trainer, ckpt_path),) = called
    assert trainer is result.trainer and trainer.max_steps == 40 and ckpt_path == checkpoint
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
    """training.write: summary.json as train assembled it, samples.json, and the lines that end the run."""
    folder = RunDir(tmp_path / "run")
    summary = {"model": "astra_alpha", "train_loss": 1.5, "val_loss": 1.25, "val_bpc": 1.8, "train_steps": 1200,
               "tokens_per_second": 52_000.0, "stopped_early": True, "stopped_at_step": 1200,
               "stop_reason": "val/loss did not improve for 2 validations in a row (patience 2)",
               "run_dir": str(tmp_path / "run"), "wall_seconds": 12.3}
    write(folder, False, summary, {"samples": ["To be"]})
    assert json.loads(folder.summary_file.read_text()) == summary
    assert json.loads(folder.samples_file.read_text()) == {"samples": ["To be"]}
    assert capsys.readouterr().out.splitlines() == [
        "stopped early at step 1,200: val/loss did not improve for 2 validations in a row (patience 2)",
        f"astra_alpha: train loss 1.5000 | val loss 1.2500 | val bpc 1.8000 | 1,200 steps at 52,000 tokens/s | "
        f"12.3 s | summary: {tmp_path / 'run'}/summary.json"]
