"""One process at a time in a run folder: flock on the folder's directory, which a killed process drops and no file
stands for; where the file system cannot lock a directory (NFS; no fcntl), a lock file, `.run.lock`, instead (one an
older version holds counts as in use too). Used through `RunDir.hold`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from gru_experiments.errors import RunFolderTaken, UserError

try:
    import fcntl
except ImportError:  # Windows: the lock file
    fcntl = None

LOCK_FILE = ".run.lock"  # the lock where a folder cannot be locked, and that of older versions


@contextmanager
def folder_lock(path: Path, in_use: str):
    """The folder's lock (the folder created if need be), held for the block; RunFolderTaken(`in_use`) at once where
    another process holds it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    release = _lock_directory(path, in_use) or _lock_file(path, in_use)
    try:
        yield
    finally:
        release()


def _lock_directory(path: Path, in_use: str) -> Callable[[], None] | None:
    """flock on the folder's directory: its release; None where the file system cannot lock a directory."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if (path / LOCK_FILE).is_file() and _held(path / LOCK_FILE):
            raise BlockingIOError
    except BlockingIOError:
        os.close(fd)
        raise RunFolderTaken(in_use) from None
    except OSError:
        os.close(fd)
        return None
    return lambda: os.close(fd)  # closing the descriptor drops the lock


def _held(lock_file: Path) -> bool:
    """Whether another process holds a lock file (one of an older version): tried without waiting, then let go."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _lock_file(path: Path, in_use: str) -> Callable[[], None]:
    """The fallback, .run.lock (filelock): its release; one that cannot be a lock file is a UserError in one line."""
    from filelock import FileLock, Timeout

    lock_file = path / LOCK_FILE
    lock = FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunFolderTaken(in_use) from None
    except OSError as error:
        raise UserError(f"cannot lock {path}: {lock_file} cannot be its lock file ({error.strerror or error}); "
                        f"remove it if no process trains in {path}, then run the command again") from None
    return lock.release
