"""The run folder: the one place that knows its layout (summary.json, samples.json, history.csv,
checkpoints/, .hydra/: docs/internals.md, *The run folder*, and docs/outputs.md).

`RunDir` reads the summary and the config and finds the run a checkpoint belongs to; `model_runs`
and `newest_run` find a model's runs. Kept free of heavy imports: sample.py resolves its output
folder's name through `model_name_for` before anything else is loaded.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.files import read_json, write_json
from gru_experiments.legacy import upgrade_config

SUMMARY, SAMPLES, HISTORY = "summary.json", "samples.json", "history.csv"
EXPLORE = "explore.html"  # sample.py explore=true: the run's page (runs/explore_run.py)
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = Path(CHECKPOINTS) / "last.ckpt"
HYDRA = ".hydra"


class RunDir:
    """One training run's folder (it need not exist yet)."""

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RunDir) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    # --- its files ----------------------------------------------------------------------
    @property
    def summary_file(self) -> Path:
        return self.path / SUMMARY

    @property
    def samples_file(self) -> Path:
        return self.path / SAMPLES

    @property
    def history_file(self) -> Path:
        return self.path / HISTORY

    @property
    def explore_file(self) -> Path:
        return self.path / EXPLORE

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def checkpoint(self) -> Path:
        """checkpoints/last.ckpt: where training keeps the last checkpoint (it may not exist yet)."""
        return self.path / LAST_CHECKPOINT

    @property
    def config_file(self) -> Path:
        return self.path / HYDRA / "config.yaml"

    def overrides_file(self) -> Path:
        """The command line the run was last started with: the newest resume's, else the original's."""
        resumed = sorted(self.path.glob(f"{HYDRA}/resumed_*/overrides.yaml"))
        return resumed[-1] if resumed else self.path / HYDRA / "overrides.yaml"

    # --- reading ------------------------------------------------------------------------
    def summary(self) -> dict | None:
        """summary.json, or None when there is none (yet) or it is unreadable."""
        summary = read_json(self.summary_file)
        return summary if isinstance(summary, dict) else None

    def samples(self) -> dict | None:
        samples = read_json(self.samples_file)
        return samples if isinstance(samples, dict) else None

    def config(self):
        """The composed training config (.hydra/config.yaml, unresolved) in today's names
        (legacy.upgrade_config: a run from before a rename says so in a line), or None."""
        return upgrade_config(OmegaConf.load(self.config_file)) if self.config_file.is_file() else None

    @property
    def finished(self) -> bool:
        """It has a summary that is not a failure record (a failed run may be resumed)."""
        summary = self.summary()
        return summary is not None and summary.get("status") != "failed"

    def recorded_model_name(self) -> str | None:
        """The model its summary, else its config, names (in today's names: legacy.upgrade_config), or None."""
        summary = self.summary()
        name = summary.get("model") if summary else None
        if not name and (config := self.config()) is not None:
            name = OmegaConf.select(config, "model.name", throw_on_resolution_failure=False)
        return upgrade_config({"model_name": name})["model_name"] if name else None

    def model_name(self) -> str | None:
        """The model it trains: its summary's, else its config's, else the folder layout's
        (runs/<model>/<time> or <num>_<model> in a sweep)."""
        if name := self.recorded_model_name():
            return name
        if self.path.parent.parent.name == "runs":
            return self.path.parent.name
        number, _, name = self.path.name.partition("_")
        return name if number.isdigit() and name else None

    def last_checkpoint(self) -> Path | None:
        """The checkpoint to sample from: the one summary.json records (looked up in this folder,
        so a moved run folder still works), else checkpoints/last.ckpt; None if there is none."""
        summary = self.summary()
        candidates = []
        if summary and summary.get("checkpoint"):
            candidates.append(self.checkpoint_dir / Path(summary["checkpoint"]).name)
        candidates.append(self.checkpoint)
        return next((c for c in candidates if c.is_file()), None)

    def last_written(self) -> float:
        """When it last wrote its summary or its last checkpoint (0 if neither exists)."""
        return max((p.stat().st_mtime for p in (self.summary_file, self.checkpoint) if p.is_file()), default=0.0)

    # --- writing ------------------------------------------------------------------------
    def write_summary(self, summary: dict) -> Path:
        return write_json(self.summary_file, summary)

    def write_samples(self, samples: dict) -> Path:
        return write_json(self.samples_file, samples)

    def write_config_record(self, config, hydra_config, overrides, subdir: str = HYDRA) -> Path:
        """config.yaml, hydra.yaml and overrides.yaml in `subdir` (.hydra, or .hydra/resumed_<time>
        for a resume), as Hydra writes them when it starts a job (the Python API's train() has no
        Hydra app to do it). Returns that folder."""
        record = self.path / subdir
        record.mkdir(parents=True, exist_ok=True)
        for name, content in (("config.yaml", config), ("hydra.yaml", hydra_config), ("overrides.yaml", overrides)):
            OmegaConf.save(content, record / name)
        return record

    # --- finding runs -------------------------------------------------------------------
    @classmethod
    def of_checkpoint(cls, checkpoint) -> RunDir | None:
        """The training run a checkpoint lives in (<run>/checkpoints/x.ckpt), if it is one."""
        checkpoint = Path(checkpoint).expanduser().resolve()
        run = cls(checkpoint.parent.parent)
        if checkpoint.parent.name == CHECKPOINTS and (run.summary_file.is_file() or (run.path / HYDRA).is_dir()):
            return run
        return None


def model_runs(log_dir, model_name: str) -> list[RunDir]:
    """Every run of `model_name` under log_dir that wrote a summary or a last checkpoint
    (finished, failed or interrupted), newest first (by `RunDir.last_written`)."""
    log_dir = Path(log_dir)
    folders = {p.parent for p in log_dir.rglob(SUMMARY)}
    folders |= {p.parents[1] for p in log_dir.rglob(LAST_CHECKPOINT.name) if p.parent.name == CHECKPOINTS}
    runs = [RunDir(folder) for folder in folders]
    return sorted((run for run in runs if run.model_name() == model_name), key=RunDir.last_written, reverse=True)


def newest_run(log_dir, model_name: str) -> RunDir | None:
    """The run of `model_name` under log_dir that wrote last and has a checkpoint, or None."""
    return next((run for run in model_runs(log_dir, model_name) if run.last_checkpoint() is not None), None)


def find_checkpoint(model_name: str, log_dir: str | Path, ckpt: str | None = None, run: str | None = None) -> Path:
    """ckpt if given, else run's last checkpoint, else that of the newest run of `model_name` under log_dir."""
    if ckpt:
        path = Path(ckpt).expanduser()
        if not path.is_file():
            raise UserError(f"checkpoint not found: {ckpt}")
        return path
    if run:
        run_dir = RunDir(Path(run).expanduser())
        if not run_dir.path.is_dir():
            raise UserError(f"run folder not found: {run}")
        path = run_dir.last_checkpoint()
        if path is None:
            raise UserError(f"no checkpoint in {run} (neither summary.json's nor {LAST_CHECKPOINT})")
        return path
    newest = newest_run(Path(log_dir), model_name)
    if newest is None:
        raise UserError(f"no trained {model_name} checkpoint under {display_path(log_dir)}/; "
                        f"train one with: python train.py model={model_name}")
    return newest.last_checkpoint()


def model_name_for(default: str, run: str | None = None, ckpt: str | None = None) -> str:
    """The model a sampling run uses, for its folder name: the run's (summary.json, else its
    config), else the checkpoint's own record, else `default` (the configured model)."""
    try:
        run_dir = RunDir(Path(run).expanduser()) if run else (RunDir.of_checkpoint(ckpt) if ckpt else None)
        if run_dir is not None:
            if name := run_dir.recorded_model_name():
                return name
        if ckpt:
            import torch  # only here: the checkpoint is memory-mapped, its hyperparameters read

            checkpoint = torch.load(Path(ckpt).expanduser(), map_location="cpu", weights_only=True, mmap=True)
            return upgrade_config(checkpoint["hyper_parameters"]).get("model_name") or default
    except Exception:  # a bad path is reported by the sampler itself, with a clear message
        pass
    return default


def display_path(path: str | Path) -> str:
    """path relative to the working directory when it is inside it (as a user typed it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
