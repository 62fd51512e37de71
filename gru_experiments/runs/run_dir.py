"""The run folder: the one place that knows its layout (docs/internals.md, *The run folder*; docs/outputs.md).
Kept free of heavy imports: sample.py names its output folder through `model_name_for` before anything is loaded.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import RunFolderTaken, UserError
from gru_experiments.files import read_json, write_json
from gru_experiments.runs.folder_lock import folder_lock
from gru_experiments.validation import MISSING, select

SUMMARY, SAMPLES, HISTORY = "summary.json", "samples.json", "history.csv"
EXPLORE = "explore.html"  # sample.py explore=true: the run's page (runs/sampling.explore_run)
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = Path(CHECKPOINTS) / "last.ckpt"
HYDRA = ".hydra"
HYDRA_RECORD = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what a job records in it


@dataclass(unsafe_hash=True)
class RunDir:
    """One training run's folder (it need not exist yet)."""
    path: Path

    def __post_init__(self):
        self.path = Path(self.path)
        self.summary_file = self.path / SUMMARY
        self.samples_file = self.path / SAMPLES
        self.history_file = self.path / HISTORY
        self.explore_file = self.path / EXPLORE
        self.checkpoint_dir = self.path / CHECKPOINTS
        self.checkpoint = self.path / LAST_CHECKPOINT  # where training keeps the last checkpoint (it may not exist)

    # --- its files ----------------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        """The config the run was last started with: the newest resume's record, else the original's."""
        resumed = sorted(self.path.glob(f"{HYDRA}/resumed_*/config.yaml"))
        return resumed[-1] if resumed else self.path / HYDRA / "config.yaml"

    def group_choices(self):
        """The option of each config group the run started with (.hydra/hydra.yaml), or None."""
        record = self.path / HYDRA / "hydra.yaml"
        return OmegaConf.select(OmegaConf.load(record), "hydra.runtime.choices") if record.is_file() else None

    # --- reading ------------------------------------------------------------------------
    def summary(self) -> dict | None:
        """summary.json, or None when there is none (yet) or it is unreadable."""
        summary = read_json(self.summary_file)
        return summary if isinstance(summary, dict) else None

    def samples(self) -> dict | None:
        samples = read_json(self.samples_file)
        return samples if isinstance(samples, dict) else None

    def config(self, upgrade=None):
        """The composed training config (.hydra/config.yaml, unresolved), or None; UserError, in one line naming the
        script that upgrades `upgrade` (default this folder), for one of an older layout (refuse_older_layout)."""
        if not self.config_file.is_file():
            return None
        config = OmegaConf.load(self.config_file)
        refuse_older_layout(config, self.path, upgrade=upgrade)
        return config

    @property
    def finished(self) -> bool:
        """It has a summary that is not a failure record (a failed run may be resumed)."""
        summary = self.summary()
        return summary is not None and summary.get("status") != "failed"

    def recorded_model_name(self) -> str | None:
        """The model its summary, else its config, names, or None (an older layout is passed over, not refused)."""
        summary = self.summary()
        name = summary.get("model") if summary else None
        if not name and self.config_file.is_file():
            name = OmegaConf.select(OmegaConf.load(self.config_file), "model.name", throw_on_resolution_failure=False)
        return name or None

    def model_name(self) -> str | None:
        """The model it trains: recorded, else the folder layout's (runs/<model>/<time>, <num>_<model> in a sweep)."""
        if name := self.recorded_model_name():
            return name
        if self.path.parent.parent.name == "runs":
            return self.path.parent.name
        number, _, name = self.path.name.partition("_")
        return name if number.isdigit() and name else None

    def last_checkpoint(self) -> Path | None:
        """The checkpoint to sample from: summary.json's (in this folder: a moved run still works), else last.ckpt;
        None if there is none."""
        recorded = (self.summary() or {}).get("checkpoint")
        candidates = [self.checkpoint_dir / Path(recorded).name] if recorded else []
        return next((c for c in [*candidates, self.checkpoint] if c.is_file()), None)

    def last_written(self) -> float:
        """When it last wrote its summary or its last checkpoint (0 if neither exists)."""
        return max((p.stat().st_mtime for p in (self.summary_file, self.checkpoint) if p.is_file()), default=0.0)

    # --- one run, one process at a time -------------------------------------------------------
    @contextmanager
    def hold(self, what: str = "train in it"):
        """The folder's lock (runs/folder_lock.py), held for the block: one process at a time trains in a run folder.
        RunFolderTaken, in one line, if another process holds it."""
        with folder_lock(self.path, f"{self.path} is in use: another process is training in it (it holds the "
                                    f"folder's lock), so this command cannot {what}; wait for that one to end (or "
                                    "stop it), then run this command again"):
            yield self

    @contextmanager
    def claim(self):
        """A new run's folder, held for the block (`hold`). RunFolderTaken, in one line, where it lies inside a run's
        folder or holds a run already (checked under the lock); nothing in it is changed."""
        if (outer := enclosing_run(self.path)) is not None:
            raise RunFolderTaken(f"{self.path} is inside the folder of a run ({outer.path}), which holds that run "
                                 "alone; a new run goes in a folder of its own (leave hydra.run.dir out, or name a "
                                 "folder outside every run's)")
        with self.hold():
            if self.holds_run():
                if self.finished:
                    held, then = "a finished run (its summary.json)", "resume= continues only a run that did not finish"
                elif self.checkpoint.is_file():
                    held, then = (f"a run that did not finish (its {LAST_CHECKPOINT})",
                                  f"continue it with: python train.py resume={self.path}")
                else:
                    held, then = ("a run that stopped before its first checkpoint",
                                  "it has no checkpoint to resume= from")
                raise RunFolderTaken(f"{self.path} holds {held}, and a run folder holds one run: {then}; a new run "
                                     "goes in a folder of its own (leave hydra.run.dir out, or name a new folder)")
            yield self

    def holds_run(self) -> bool:
        """Whether a run has trained here: its summary, learning curves, checkpoints or config record."""
        traces = (self.summary_file, self.history_file, self.path / HYDRA)
        return any(p.exists() for p in traces) or self.checkpoint_dir.is_dir() and any(self.checkpoint_dir.iterdir())

    # --- writing ------------------------------------------------------------------------
    def write_summary(self, summary: dict) -> Path:
        return write_json(self.summary_file, summary)

    def record_config(self, config: dict, resumed: bool = False) -> Path | None:
        """This job's config record (`config` unresolved) in .hydra/, a resume's in .hydra/resumed_<time>/, written
        once every check has passed (Hydra records nothing itself: conf/hydra/default.yaml). None without Hydra."""
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        hydra = HydraConfig.instance().cfg
        subdir = f"{HYDRA}/resumed_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S_%f')}" if resumed else HYDRA
        return self.write_config_record(config, hydra, hydra.hydra.overrides.task, subdir)

    def write_config_record(self, config, hydra_config, overrides, subdir: str = HYDRA) -> Path:
        """config.yaml, hydra.yaml and overrides.yaml in `subdir`. Returns that folder."""
        record = self.path / subdir
        record.mkdir(parents=True, exist_ok=True)
        for name, content in zip(HYDRA_RECORD, (config, hydra_config, overrides)):
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


def enclosing_run(path) -> RunDir | None:
    """The run whose folder holds `path` at any depth (known by its config record or last checkpoint), or None."""
    for parent in Path(path).resolve().parents:
        if (parent / HYDRA).is_dir() or (parent / LAST_CHECKPOINT).is_file():
            return RunDir(parent)
    return None


def model_runs(log_dir, model_name: str) -> list[RunDir]:
    """Every run of `model_name` under log_dir with a summary or a last checkpoint, newest first."""
    log_dir = Path(log_dir)
    folders = {p.parent for p in log_dir.rglob(SUMMARY)}
    folders |= {p.parents[1] for p in log_dir.rglob(LAST_CHECKPOINT.name) if p.parent.name == CHECKPOINTS}
    runs = [RunDir(folder) for folder in folders]
    return sorted((run for run in runs if run.model_name() == model_name), key=RunDir.last_written, reverse=True)


def newest_run(log_dir, model_name: str) -> RunDir | None:
    """The run of `model_name` under log_dir that wrote last and has a checkpoint, or None."""
    return next((run for run in model_runs(log_dir, model_name) if run.last_checkpoint() is not None), None)


def run_folder(resume, log_dir, model_name: str, stamp: str) -> str:
    """hydra.run.dir (conf/hydra/default.yaml): the folder of the run that resume= names, where there is one, else
    a new one, <log_dir>/runs/<model>/<stamp> (resume_run refuses what cannot be resumed)."""
    if resume is not None:
        run = newest_run(log_dir, model_name) if str(resume) == "last" else RunDir(Path(str(resume)).expanduser())
        if run is not None and run.path.is_dir():
            return str(run.path.resolve())
    return str(Path(str(log_dir)) / "runs" / model_name / stamp)


OmegaConf.register_new_resolver("run_folder", run_folder, replace=True)


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
    """The model a sampling run uses, for its folder name: the run's, else the checkpoint's, else `default`."""
    try:
        run_dir = RunDir(Path(run).expanduser()) if run else (RunDir.of_checkpoint(ckpt) if ckpt else None)
        if run_dir is not None and (name := run_dir.recorded_model_name()):
            return name
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


# --- run folders of an older layout ------------------------------------------------------------
# The package reads today's layout only. A run folder, checkpoint or sweep written under names since renamed or
# dropped is refused in one line naming the script that upgrades it in place, once; the renamings live in that
# script alone (tools/upgrade_run_folder.py, docs/configuration.md: old names).
UPGRADE_SCRIPT = "tools/upgrade_run_folder.py"
# One key gone since from each older layout: the flat evaluation keys (issue 35), the evaluation's token counts
# (before evaluation.budget), a probe before its phases, the recipe before conf/optim, the epochs before model.epochs
# (trainer.max_epochs: in every config until then, so it marks one of any older layout whatever else it says).
GONE_KEYS = ("evaluation.text_samples", "evaluation.windowed_stride", "probe.distances", "weight_decay",
             "trainer.max_epochs")
PACKAGE = "gru_experiments."


def older_layout(record) -> str | None:
    """What marks a run's config or a checkpoint's hyper-parameters as of an older layout, as `key=value`, or None."""
    plain = OmegaConf.to_container(record, resolve=False) if OmegaConf.is_config(record) else record
    if not isinstance(plain, dict):
        return None

    def get(key: str):
        return None if (value := select(plain, key)) is MISSING else value

    def old_class(key: str) -> bool:  # the package's own model class from before models/ (a user's is no old name)
        target = str(get(key))
        return target.startswith(PACKAGE) and not target.startswith(PACKAGE + "models.")

    marks = {"optim.name": get("optim.name") == "seed",
             "model.name": str(get("model.name")).endswith("_seed"),
             "model_name": str(get("model_name")).endswith("_seed"),  # a checkpoint's
             "model.architecture._target_": old_class("model.architecture._target_"),
             "architecture._target_": old_class("architecture._target_") or (  # a checkpoint's, which names one
                 isinstance(get("architecture"), dict) and get("architecture._target_") is None),
             **{key: get(key) is not None for key in GONE_KEYS}}
    return next((f"{key}={get(key)}" for key, old in marks.items() if old), None)


def refuse_older_layout(record, where, kind: str = "run folder", upgrade=None) -> None:
    """UserError, in one line naming the script that upgrades `upgrade` (default `where`), where `record` (a config
    or a checkpoint's hyper-parameters) is of an older layout; nothing is written."""
    if (mark := older_layout(record)) is not None:
        raise UserError(f"{display_path(where)}: a {kind} of an older layout ({mark}); upgrade it once with: "
                        f"python {UPGRADE_SCRIPT} {display_path(upgrade or where)}")
