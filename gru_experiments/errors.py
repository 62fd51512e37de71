"""Errors the user can fix, and the one place where scripts turn them into a one-line message.

The library raises `UserError` (or a subclass) for anything caused by the input rather than
by a bug: a bad config value, a missing or unreadable corpus, an unusable checkpoint. Its
message says what is wrong and what to do. Scripts run their work inside `reported_errors()`:

    @hydra.main(...)
    def main(cfg):
        with reported_errors(cfg):
            ...

which prints `error: <message>` on one line to stderr and exits with status 2, without a
traceback. `debug=true` on the command line or HYDRA_FULL_ERROR=1 in the environment
re-raises instead, so the full traceback is shown. Any other exception is a bug and keeps
its traceback.

This module imports nothing heavy (no torch, only Hydra), so scripts can use it before their imports.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A problem with the user's input; the message says what to do about it."""


class TrainingDiverged(UserError):
    """The loss or the weights became non-finite; the last good checkpoint is kept."""


class NoResultsError(UserError):
    """A sweep folder holds no finished job to report on."""


def _truthy(value) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def debug_requested(cfg=None, argv: list[str] | None = None) -> bool:
    """Full tracebacks wanted: HYDRA_FULL_ERROR=1, `debug=true` in the config, or on the command line."""
    if _truthy(os.environ.get("HYDRA_FULL_ERROR", "")):
        return True
    if cfg is not None and _truthy(cfg.get("debug", False)):
        return True
    for arg in argv or []:
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "debug" and _truthy(value):
            return True
    return False


def one_line(message: str) -> str:
    return " ".join(str(message).split())


class JobFailed(CompactHydraException):
    """A multirun job's UserError: Hydra prints a CompactHydraException as its message alone."""


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


HYDRA_RECORD = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def discard_untouched_run_dir(log_dir=None) -> bool:
    """Remove this Hydra run's folder if it holds nothing but what Hydra wrote when the job
    started (.hydra/ and an empty log), so input errors leave no empty run folders behind;
    then its parents that are left empty, below `log_dir` (when given).
    A folder with anything else in it (a resumed run's checkpoints, logs with content) stays."""
    if not HydraConfig.initialized():
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
    for path in [*record.glob("*"), log]:
        path.unlink(missing_ok=True)
    if record.exists():
        record.rmdir()
    run_dir.rmdir()
    if log_dir is not None:
        log_dir = Path(log_dir).resolve()
        for parent in run_dir.resolve().parents:
            if parent == log_dir or log_dir not in parent.parents or any(parent.iterdir()):
                break
            parent.rmdir()
    return True


@contextmanager
def reported_errors(cfg=None, argv: list[str] | None = None):
    """Run a script's work; a UserError becomes `error: <message>` on stderr and exit status 2.

    Inside a Hydra multirun the other jobs must still run, so the job fails the Hydra way
    instead: Hydra finishes the batch, then prints the one-line message and exits 1.
    """
    try:
        yield
    except UserError as err:
        if debug_requested(cfg, argv):
            raise
        message = f"error: {one_line(err)}"
        if _in_multirun():
            print(message, file=sys.stderr, flush=True)
            raise JobFailed(f"error: multirun job {HydraConfig.get().job.num} failed: {one_line(err)}") from None
        print(message, file=sys.stderr, flush=True)
        discard_untouched_run_dir(OmegaConf.select(cfg, "paths.log_dir") if cfg is not None else None)
        sys.exit(EXIT_USER_ERROR)
