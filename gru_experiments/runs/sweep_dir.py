"""The sweep folder: one sweep's, as a run folder is one run's; continued, or refused to another (docs/sweeps.md)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from gru_experiments.errors import UserError
from gru_experiments.runs.folder_lock import folder_lock
from gru_experiments.runs.run_dir import HYDRA, RunDir, enclosing_run

MULTIRUN = "multirun.yaml"  # Hydra's record of a multirun, written into its sweep folder when it starts


def recorded_overrides(record: Path) -> list[str]:
    """The task overrides a multirun.yaml or a job's .hydra/overrides.yaml records ([] where there are none)."""
    found = OmegaConf.load(record) if record.is_file() else None
    if OmegaConf.is_dict(found):
        found = OmegaConf.select(found, "hydra.overrides.task", default=None)
    return [str(o) for o in found] if OmegaConf.is_list(found) else []


def task_overrides(command: list[str]) -> list[str]:
    """The overrides of a train.py command that Hydra records as the task's (not hydra.* nor hydra/...)."""
    return [o for o in command if "=" in o and not o.lstrip("+~").startswith(("hydra.", "hydra/"))]


@dataclass
class SweepDir:
    """One sweep's folder (it need not exist yet)."""
    path: Path

    def __post_init__(self):
        self.path = Path(self.path)
        self.multirun = self.path / MULTIRUN

    def refuse_unfit(self) -> None:
        """UserError for a sweep folder that cannot be one: a file (or under one), a run's folder, or inside one."""
        existing = next(p for p in (self.path, *self.path.parents) if p.exists())
        if not existing.is_dir():
            where = "" if existing == self.path else f": {existing}"
            raise UserError(f"hydra.sweep.dir={self.path}{where} is a file; the sweep folder is a folder "
                            "(leave hydra.sweep.dir out, or name a new folder)")
        run = RunDir(self.path) if RunDir(self.path).holds_run() else enclosing_run(self.path)
        if run is not None:
            raise UserError(f"hydra.sweep.dir={self.path} is {'' if run.path == self.path else 'inside '}the folder "
                            f"of a run ({run.path}), which holds that run alone; a sweep goes in a folder of its own "
                            "(leave hydra.sweep.dir out, or name a new folder)")

    @contextmanager
    def claim(self, overrides: list[str]):
        """The folder's lock, held for the block; yields whether the folder holds this sweep already (the same task
        `overrides`: it is continued). Nothing is written but the folder itself."""
        self.refuse_unfit()
        with folder_lock(self.path, f"{self.path} is in use: another sweep is running in it (it holds the folder's "
                                    "lock), so this sweep cannot start there; wait for that one to end (or stop it), "
                                    "then run this command again, or name another folder (hydra.sweep.dir)"):
            yield self.refuse_another(overrides)

    def refuse_another(self, overrides: list[str]) -> bool:
        """Whether the folder holds this very sweep (the same task overrides, in any order); another: UserError."""
        if not self.multirun.is_file():
            if any(self.path.glob(f"*/{HYDRA}")):
                raise UserError(f"{self.path} holds job folders but no {MULTIRUN}: not a sweep that sweep.py can "
                                "continue; a sweep goes in a folder of its own (name a new hydra.sweep.dir)")
            return False
        recorded = recorded_overrides(self.multirun)
        if sorted(recorded) == sorted(overrides):
            return True
        differs = "; ".join(f"{whose} {' '.join(extra)}" for whose, extra in (
            ("it ran with", [o for o in recorded if o not in overrides]),
            ("this command asks for", [o for o in overrides if o not in recorded])) if extra)
        raise UserError(f"{self.path} holds another sweep ({differs}), and a sweep folder holds one sweep: the same "
                        "command again continues it; this one goes in a folder of its own (leave hydra.sweep.dir "
                        "out, or name a new folder); nothing was written")

    def cut_jobs(self) -> list[RunDir]:
        """Its jobs that stopped before their end with a checkpoint to resume from (no summary, or a failed one)."""
        jobs = sorted(p.parent for p in self.path.glob(f"*/{HYDRA}"))
        return [RunDir(job) for job in jobs if RunDir(job).checkpoint.is_file() and not RunDir(job).finished]


def completed_job(cfg) -> dict | None:
    """In a multirun job: the summary of this very job where its folder holds it completed already, else None."""
    from hydra.core.hydra_config import HydraConfig

    from gru_experiments.runs.jobs import multirun_job

    if not multirun_job():
        return None
    run = RunDir(OmegaConf.select(cfg, "paths.output_dir"))
    if not run.finished:
        return None
    same = sorted(recorded_overrides(run.path / HYDRA / "overrides.yaml")) == sorted(HydraConfig.get().overrides.task)
    return run.summary() if same else None
