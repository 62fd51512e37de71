"""Real training runs: the model learns, checkpoints rebuild it, W&B stays offline, multirun jobs stay apart."""

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import REPO
from robustness_helpers import TINY, fail_in_process
from wandb_records import offline_runs

from gru_experiments.data.corpus import read_corpus, split_text
from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.task import LanguageModelTask, load_checkpoint
from gru_experiments.runs.training import train


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
