"""Helpers shared by the test files that hold docs/robustness.md's promises: running train.py as a real process
or in this one (its one error line), composing its config, killing or interrupting a run, and fingerprinting
folders to prove a failed command left them untouched. (The `workspace` a bad command must not touch is
conftest.py's fixture.)"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import CONF
from hydra import compose, initialize_config_dir

from gru_experiments.runs import training
from gru_experiments.runs.jobs import job

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"

# A tiny, fast run: astra_alpha on a small corpus, small batches, no logger.
TINY = ["logger=none", "data.batch_size=8", "data.seq_len=32", "data.eval_batch_size=64",
        "trainer.enable_progress_bar=false", "trainer.accelerator=cpu"]


# Why a test of a command that needs a CUDA GPU cannot run here (None where torch sees one).
NO_GPU = "torch sees no CUDA GPU on this machine" if not torch.cuda.is_available() else None


def compose_in(root: Path, *overrides: str, output_dir: Path | None = None):
    """The train config with the workspace's outputs/ and data/ (as train.py would use them)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=[
            f"paths.root_dir={root}", f"paths.output_dir={output_dir or root / 'outputs' / 'failed'}",
            *TINY, *overrides])


def train(cfg) -> dict:
    """runs.training.train(cfg) in the run's one job, as train.py runs it (runs/jobs.job: a failure recorded, the
    logger closed)."""
    with job(cfg, record=True) as current:
        return training.train(cfg, current)


def fail_in_process(capsys, cfg) -> str:
    """Run train(cfg) the way train.py does; return the one error line (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info, job(cfg, record=True, report=True) as current:
        training.train(cfg, current)
    assert exit_info.value.code == 2
    return error_line(capsys.readouterr().err)


def script_env(root: Path, **extra) -> dict:
    env = dict(os.environ, PROJECT_ROOT=str(root), PYTHONPATH=str(REPO), WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("HYDRA_FULL_ERROR", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_script(root: Path, *overrides: str, script: Path = TRAIN_PY, timeout: int = 300,
               **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *overrides], cwd=REPO, env=script_env(root, **env),
                          capture_output=True, text=True, timeout=timeout)


def start_script(root: Path, *overrides: str, script: Path = TRAIN_PY, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), *overrides], cwd=REPO, env=script_env(root, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# train.py as a real process, killed with SIGKILL (no cleanup, no finally) right after it writes a
# checkpoints/last.ckpt of training step KILL_AT_STEP: its first write of that step.
KILL_AFTER_CHECKPOINT = textwrap.dedent(f"""
    import os, runpy, signal, sys
    from gru_experiments.runs.checkpoints import AtomicCheckpointIO

    step = int(os.environ["KILL_AT_STEP"])
    save = AtomicCheckpointIO.save_checkpoint

    def save_and_die(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if checkpoint.get("global_step") == step and os.path.basename(path) == "last.ckpt":
            os.kill(os.getpid(), signal.SIGKILL)

    AtomicCheckpointIO.save_checkpoint = save_and_die
    sys.argv = [{str(TRAIN_PY)!r}, *sys.argv[1:]]
    runpy.run_path({str(TRAIN_PY)!r}, run_name="__main__")
""")


def run_killed_after_checkpoint(root: Path, step: int, *overrides: str) -> subprocess.CompletedProcess:
    """train.py with `overrides` under `root`, killed right after its last.ckpt of `step` is written."""
    killer = root / "kill_after_checkpoint.py"
    root.mkdir(parents=True, exist_ok=True)
    killer.write_text(KILL_AFTER_CHECKPOINT)
    return run_script(root, *overrides, script=killer, KILL_AT_STEP=step)


def fingerprint(*folders: Path) -> dict[str, str]:
    """sha256 of every file under the folders (symlinks by target)."""
    prints = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_symlink():
                prints[str(path)] = "link:" + os.readlink(path)
            elif path.is_file():
                prints[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return prints


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (sha256) and folder under `folder`, by its path relative to it."""
    return {**{str(Path(p).relative_to(folder)): digest for p, digest in fingerprint(folder).items()},
            **{str(p.relative_to(folder)): "folder" for p in folder.rglob("*") if p.is_dir()}}


def assert_untouched(before: dict[str, str], after: dict[str, str]) -> None:
    """Every file that existed is still there with the same content, and nothing was added (but the SentencePiece
    cache's lock files, which filelock leaves in place, and the corpus's prepared ids, data/token_ids.py: a cache of
    the text, written once whatever becomes of the command, which the next run reads)."""
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    assert not changed, f"files changed or removed: {changed}"
    cached = lambda p: Path(p).parent.name == "tokenizers" and Path(p).name.startswith("ids-")  # noqa: E731
    added = [p for p in after.keys() - before.keys() if not p.endswith(".lock") and not cached(p)]
    assert not added, f"files written: {added}"


def error_line(stderr: str) -> str:
    """The one line a user error prints (the last line of stderr), checked to be the only error output."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), stderr
    return lines[-1]


class Interrupted(Exception):
    """A training run cut off by a test at a chosen step (interrupt_at), as a kill would."""


def interrupt_at(monkeypatch, step: int) -> None:
    """Every LanguageModelTask raises Interrupted after training step `step`."""
    from gru_experiments.runs.task import LanguageModelTask
    original = LanguageModelTask.on_train_batch_end

    def on_train_batch_end(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == step:
            raise Interrupted(f"interrupted at step {step}")

    monkeypatch.setattr(LanguageModelTask, "on_train_batch_end", on_train_batch_end)
