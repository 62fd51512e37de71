"""What happens when a job fails, in one place (docs/internals.md); nothing heavy imported, so scripts use it first.
It reads the job's config itself (as the entry points, runs/checks.py and runs/resume.py do): a failure is recorded
whether or not that config passed validation."""

import os
import re
import shutil
import sys
import time
import traceback
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

from gru_experiments.errors import RunFolderTaken, TrainingDiverged, UserError
from gru_experiments.files import disk_error
from gru_experiments.runs.run_dir import HYDRA, HYDRA_RECORD, RunDir  # also registers conf/hydra's run_folder resolver

EXIT_USER_ERROR = 2
EXIT_DISK_FULL = 3  # the disk (or quota) filled up: free space, then resume


@dataclass
class Job:
    """The running job, timed: `logger` (set once built) is where a failure is recorded."""
    logger: object = False
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


class JobFailed(CompactHydraException):
    """A multirun job's UserError: Hydra prints a CompactHydraException as its message alone."""


@contextmanager
def job(cfg=None, argv: list[str] | None = None, *, record: bool = False, report: bool = False) -> Iterator[Job]:
    current = Job()
    try:
        yield current
    except BaseException as error:
        # A folder that another run or process holds (RunFolderTaken) gets no failure record: it is not this job's.
        recordable = isinstance(error, Exception) and not isinstance(error, RunFolderTaken)
        if record and recordable and (multirun_job() or isinstance(error, TrainingDiverged)) and is_first_rank():
            # Bookkeeping must never hide the error it reports.
            with suppress(Exception):
                current.logger = record_failure(cfg, current.logger, error, current.seconds)
        close_logger(exit_code=1)
        if report and not debug_requested(cfg, argv):
            if isinstance(error, UserError):
                _exit_with_one_line(error, cfg)
            full = disk_error(error)
            if full is not None:
                _exit_with_one_line(disk_full_message(full, cfg), cfg, EXIT_DISK_FULL)
        raise
    close_logger(exit_code=0)


def record_failure(cfg, logger, error: Exception, seconds: float):
    """summary.json (and W&B) with status "failed" and the error; the logger to close."""
    from gru_experiments.runs.checks import model_family, model_recurrent
    from gru_experiments.runs.loggers import build_logger, is_wandb

    run = RunDir(OmegaConf.select(cfg, "paths.output_dir"))
    summary = {
        "status": "failed",
        "model": OmegaConf.select(cfg, "model.name"),
        "family": model_family(OmegaConf.select(cfg, "model.architecture", default=None)),
        "recurrent": model_recurrent(OmegaConf.select(cfg, "model.architecture", default=None)),
        "tokenizer": OmegaConf.select(cfg, "tokenizer.kind"),
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__, limit=-8)),
        "wall_seconds": seconds,
        "run_dir": str(run.path),
    }
    run.write_summary(summary)
    if not (run.path / HYDRA).is_dir():  # failed before train() recorded it: the sweep report finds a job by it
        run.record_config(OmegaConf.to_container(cfg, resolve=False))
    if not logger and cfg.get("logger"):
        plain = OmegaConf.to_container(cfg, resolve=True)
        logger = build_logger(plain["logger"], plain)
    if is_wandb(logger):
        logger.experiment.summary.update({"status": "failed", "error": summary["error"]})
    return logger


def close_logger(exit_code: int = 0) -> None:
    """End wandb's current run (a failure may have left one open), so that the next multirun job starts its own."""
    wandb = sys.modules.get("wandb")  # never imported here just to close nothing
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


def _exit_with_one_line(error, cfg, status: int = EXIT_USER_ERROR) -> None:
    message = f"error: {one_line(error)}"
    print(message, file=sys.stderr, flush=True)
    if multirun_job():
        raise JobFailed(f"error: multirun job {HydraConfig.get().job.num} failed: {one_line(error)}") from None
    discard_untouched_run_dir(OmegaConf.select(cfg, "paths.log_dir") if OmegaConf.is_config(cfg) else None, error)
    sys.exit(status)


def disk_full_message(error: OSError, cfg) -> str:
    """The file a full disk stopped, the run's last good checkpoint and the command that resumes from it."""
    what = f"could not write {error.filename}" if error.filename else "could not write a file"
    run_dir = OmegaConf.select(cfg, "paths.output_dir") if OmegaConf.is_config(cfg) else None
    path = RunDir(run_dir).checkpoint if run_dir else None
    if path is None or not path.is_file():
        return f"no space left on device: {what}; free some space, then run the same command again"
    step = None
    with suppress(Exception):  # the message must come out whatever the file holds
        from gru_experiments.runs.checkpoints import read_checkpoint

        step = int(read_checkpoint(path, mmap=True, require=()).get("global_step"))
    return (f"no space left on device: {what}; the last good checkpoint is {path}"
            f"{'' if step is None else f' (step {step})'}; free some space, then resume with: "
            f"python train.py resume={run_dir}")


def command_line(argv: list[str]) -> list[str]:
    """A script's arguments as Hydra's override parser takes them: a value's leading `~/` expanded (a shell does not,
    after data.path=); an override refused over a character beyond ASCII, a UserError saying how to quote it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    home = os.path.expanduser("~")
    parser, arguments = OverridesParser.create(), list(argv[:1])
    for arg in argv[1:]:
        key, equals, value = arg.partition("=")
        if equals and not arg.startswith("-") and not value.startswith(("'", '"')):
            value = re.sub(r"(^|,)~(?=/)", lambda m: m[1] + home, value)
            arg = f"{key}={value}"
            try:
                parser.parse_overrides([arg])
            except OverrideParseException:
                if not value.isascii():
                    raise UserError(f"{arg}: Hydra's command line takes a value with characters beyond ASCII only "
                                    f"quoted: {key}='{value}' (in a shell: \"{key}='{value}'\")") from None
        arguments.append(arg)
    return arguments


def one_line(message) -> str:
    return " ".join(str(message).split())


def debug_requested(cfg=None, argv: list[str] | None = None) -> bool:
    """Full tracebacks wanted: HYDRA_FULL_ERROR=1, `debug=true` in the config, or on the command line."""
    flags = [os.environ.get("HYDRA_FULL_ERROR", ""), cfg.get("debug", False) if cfg is not None else False]
    flags += [value for key, _, value in (arg.lstrip("+~").partition("=") for arg in argv or []) if key == "debug"]
    return any(str(flag).strip().lower() in {"1", "true", "yes", "on"} for flag in flags)


def multirun_job() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def is_first_rank() -> bool:
    """Not one of DDP's ranks 1..: only the first records a failure and holds the run folder's lock."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only  # only when asked: imports lightning

    return getattr(rank_zero_only, "rank", 0) == 0


def discard_untouched_run_dir(log_dir=None, error=None) -> bool:
    """Remove this Hydra run's folder (and its parents left empty, below `log_dir`) if it holds only what Hydra wrote
    at the start: input errors leave no empty run folders. Never after a RunFolderTaken: the folder is another's."""
    if not HydraConfig.initialized() or isinstance(error, RunFolderTaken):
        return False
    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    record = run_dir / ".hydra"
    log = run_dir / f"{hydra.job.name}.log"
    if not run_dir.is_dir() or {p.name for p in run_dir.iterdir()} - {record.name, log.name}:
        return False
    if (log.exists() and log.stat().st_size) or (record.exists() and (
            not record.is_dir() or any(p.name not in HYDRA_RECORD or p.is_dir() for p in record.iterdir()))):
        return False
    shutil.rmtree(run_dir)
    if log_dir is not None:
        log_dir = Path(log_dir).resolve()
        for parent in run_dir.resolve().parents:
            if parent == log_dir or log_dir not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()
    return True
