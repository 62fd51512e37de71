"""Checkpoints written before the package moved into subpackages still load, sample and resume.

They name their class by its old path (`gru_experiments.model.RecurrentLM`, `gru_experiments.mlp.BengioMLP`);
run_dir.MOVED_CLASSES maps them to today's. The fast test rewrites a fresh checkpoint's class
path to the old one; the slow one has the code of main before the move (commit OLD_MAIN, from git) write
real checkpoints, then today's code loads them (gru_experiments.load), samples them (sample.py run=...)
and resumes them (train.py resume=...)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
import torch
from robustness_helpers import REPO, TINY, run_script

import gru_experiments
from gru_experiments.runs.checkpoints import atomic_torch_save, read_checkpoint
from gru_experiments.runs.run_dir import MOVED_CLASSES
from gru_experiments.runs.training import train

OLD_MAIN = "9d1cd15392d7a99c56d375dc04ee8fecb690cca2"  # the flat layout, as users had it
OLD_PATHS = {"astra_alpha": "gru_experiments.model.RecurrentLM", "mlp": "gru_experiments.mlp.BengioMLP"}


@pytest.mark.parametrize("model", ["astra_alpha", "mlp"])
def test_a_checkpoint_naming_the_old_class_path_loads(compose_config, tiny_corpus, tmp_path, model):
    summary = train(compose_config(*TINY, f"data.path={tiny_corpus}", f"model={model}", "trainer.max_steps=2",
                                   "evaluation.budget=1"))  # a sampled, quick evaluation
    checkpoint = read_checkpoint(summary["checkpoint"])
    assert checkpoint["hyper_parameters"]["architecture"]["_target_"] == MOVED_CLASSES[OLD_PATHS[model]]
    checkpoint["hyper_parameters"]["architecture"]["_target_"] = OLD_PATHS[model]
    old = tmp_path / "old.ckpt"
    atomic_torch_save(checkpoint, old)
    lm = gru_experiments.load(old)
    assert type(lm.model).__module__ + "." + type(lm.model).__name__ == MOVED_CLASSES[OLD_PATHS[model]]
    assert len(lm.generate("ab", mode="stateful", max_new_tokens=5, seed=1)) >= 5


def old_main(tmp_path):
    """The package and scripts of OLD_MAIN, from this repository's git history."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD_MAIN], capture_output=True, timeout=120)
    assert archive.returncode == 0, f"commit {OLD_MAIN} not in this clone's history: {archive.stderr.decode()}"
    root = tmp_path / "old_main"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


# Run the old train.py and SIGKILL it after step 3: last.ckpt holds step 2 (checkpoint.every_n_steps=2).
KILL_OLD_RUN = """
import os, runpy, signal, sys
from gru_experiments.lightning_module import LanguageModelTask  # the flat layout's module

original = LanguageModelTask.on_train_batch_end

def on_train_batch_end(self, outputs, batch, batch_idx):
    original(self, outputs, batch, batch_idx)
    if self.global_step == 3:
        os.kill(os.getpid(), signal.SIGKILL)

LanguageModelTask.on_train_batch_end = on_train_batch_end
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("model", ["astra_alpha", "mlp"])
def test_checkpoints_of_the_flat_layout_load_sample_and_resume(tmp_path, tiny_corpus, model):
    old = old_main(tmp_path)
    (old / "kill_at_step_3.py").write_text(KILL_OLD_RUN)
    runs = tmp_path / "runs"
    recipe = [*TINY, f"data.path={tiny_corpus}", f"model={model}", "model.steps_per_epoch=4", "model.epochs=2",
              "checkpoint.every_n_steps=2",  # killed at step 3, before its first validation or evaluation
              "evaluation.windowed_stride=20"]  # a key of the old evaluation, gone since issue 25
    killed = subprocess.run([sys.executable, "kill_at_step_3.py", *recipe], cwd=old, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "PROJECT_ROOT": str(runs), "PYTHONPATH": str(old),
                                              "WANDB_MODE": "offline"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = (runs / "outputs" / "runs" / model).iterdir()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)  # as written: read_checkpoint upgrades it
    assert ckpt["hyper_parameters"]["architecture"]["_target_"] == OLD_PATHS[model]  # written by the old code
    assert ckpt["global_step"] == 2 and not (run / "summary.json").exists()

    lm = gru_experiments.load(run)
    assert len(lm.generate("ab", mode="stateless", max_new_tokens=4, seed=0)) >= 4
    sampled = run_script(runs, f"run={run}", "prompt=arbre", "max_new_tokens=20", "num_samples=1",
                         script=REPO / "sample.py")
    assert sampled.returncode == 0, sampled.stderr[-3000:]

    resumed = run_script(runs, f"resume={run}", "evaluation.budget=1")  # a sampled, quick evaluation
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    gone = next(line for line in resumed.stdout.splitlines() if "gone since, left out" in line)
    assert "trainer.max_epochs" in gone and "evaluation.windowed_stride" in gone  # the old config's keys, said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["train_steps"] == 8
    assert torch.isfinite(torch.tensor(summary["val_loss"]))
