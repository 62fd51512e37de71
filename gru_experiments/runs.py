"""Finding trained runs and their checkpoints under the outputs folder.

A training run's folder holds summary.json (with "model" and "checkpoint", the last checkpoint),
checkpoints/last.ckpt and .hydra/config.yaml. Kept free of heavy imports: sample.py resolves
its output folder's name through `model_name_for` before anything else is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError


def read_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def run_checkpoint(run_dir: Path, summary: dict | None = None) -> Path | None:
    """The run's last checkpoint: summary.json's "checkpoint" if that file exists (else its file
    name inside this folder, for a run folder that was moved), else checkpoints/last.ckpt."""
    run_dir = Path(run_dir)
    summary = summary if summary is not None else read_summary(run_dir)
    candidates = []
    if summary and summary.get("checkpoint"):
        recorded = Path(summary["checkpoint"])
        candidates += [recorded, run_dir / "checkpoints" / recorded.name]
    candidates.append(run_dir / "checkpoints" / "last.ckpt")
    return next((c for c in candidates if c.is_file()), None)


def newest_checkpoint(model_name: str, log_dir: Path) -> Path | None:
    """The last checkpoint of the newest run (by summary.json's mtime) of `model_name` under log_dir."""
    summaries = []
    for path in Path(log_dir).rglob("summary.json"):
        summary = read_summary(path.parent)
        if summary and summary.get("model") == model_name:
            summaries.append((path.stat().st_mtime, path.parent, summary))
    for _, run_dir, summary in sorted(summaries, key=lambda s: s[0], reverse=True):
        checkpoint = run_checkpoint(run_dir, summary)
        if checkpoint is not None:
            return checkpoint
    return None


def find_checkpoint(model_name: str, log_dir: str | Path, ckpt: str | None = None, run: str | None = None) -> Path:
    """ckpt if given, else run's last checkpoint, else the newest trained `model_name` under log_dir."""
    if ckpt:
        path = Path(ckpt).expanduser()
        if not path.is_file():
            raise UserError(f"checkpoint not found: {ckpt}")
        return path
    if run:
        run_dir = Path(run).expanduser()
        if not run_dir.is_dir():
            raise UserError(f"run folder not found: {run}")
        path = run_checkpoint(run_dir)
        if path is None:
            raise UserError(f"no checkpoint in {run} (neither summary.json's nor checkpoints/last.ckpt)")
        return path
    path = newest_checkpoint(model_name, Path(log_dir))
    if path is None:
        raise UserError(f"no trained {model_name} checkpoint under {display_path(log_dir)}/; "
                          f"train one with: python train.py model={model_name}")
    return path


def run_dir_of(checkpoint: Path) -> Path | None:
    """The training run folder a checkpoint lives in (<run>/checkpoints/x.ckpt), if it is one."""
    run_dir = Path(checkpoint).resolve().parent.parent
    if Path(checkpoint).resolve().parent.name == "checkpoints" and (
            (run_dir / "summary.json").is_file() or (run_dir / ".hydra").is_dir()):
        return run_dir
    return None


def training_config(run_dir: Path | None):
    """The run's composed training config (.hydra/config.yaml, unresolved), or None."""
    path = Path(run_dir) / ".hydra" / "config.yaml" if run_dir else None
    return OmegaConf.load(path) if path and path.is_file() else None


def model_name_for(default: str, run: str | None = None, ckpt: str | None = None) -> str:
    """The model a sampling run uses, for its folder name: the run's (summary.json, else its
    config), else the checkpoint's own record, else `default` (the configured model)."""
    try:
        run_dir = Path(run).expanduser() if run else (run_dir_of(Path(ckpt).expanduser()) if ckpt else None)
        if run_dir is not None:
            summary = read_summary(run_dir)
            if summary and summary.get("model"):
                return summary["model"]
            config = training_config(run_dir)
            if config is not None and OmegaConf.select(config, "model.name"):
                return OmegaConf.select(config, "model.name")
        if ckpt:
            import torch  # only here: the checkpoint is memory-mapped, its hyperparameters read

            checkpoint = torch.load(Path(ckpt).expanduser(), map_location="cpu", weights_only=True, mmap=True)
            return checkpoint["hyper_parameters"].get("model_name") or default
    except Exception:  # a bad path is reported by the sampler itself, with a clear message
        pass
    return default


def display_path(path: str | Path) -> str:
    """path relative to the working directory when it is inside it (as a user typed it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
