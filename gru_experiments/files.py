"""Writing files so that nobody ever sees half of one.

Every file the project writes that someone else may read while it is being written (a run's
summary.json and samples.json, the report's files, checkpoints, the SentencePiece cache, the
corpus download) goes through `atomic_file`: the content goes to a temporary file in the
target's folder, is flushed to disk, and is then renamed over the target. A reader, a second
writer, or a kill at any moment sees the old file or the new one, never a mix; a write that
fails leaves no temporary file behind.

Appends (history.csv) and files that belong to one process (logs) are written directly.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

TMP_SUFFIX = ".tmp"


def temporary_name(path: Path) -> Path:
    """A hidden name next to `path`, unique to this process and call: .<name>.<pid>.<random>.tmp."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def leftover_temporaries(folder: Path, name: str = "*") -> list[Path]:
    """Temporary files of writes that were cut short (by a kill) in `folder`, for targets matching `name`."""
    return sorted(Path(folder).glob(f".{name}.*{TMP_SUFFIX}"))


@contextmanager
def atomic_file(path, mode: str = "wb") -> Iterator[BinaryIO]:
    """Open a temporary file for writing; on success it replaces `path` atomically.

        with atomic_file(path) as f:
            f.write(data)

    `mode` is "wb" or "w" (text, UTF-8). The folder is created if needed. The file gets the
    usual permissions (not mkstemp's private 0600).
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file writes a new file: mode 'wb' or 'w', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "xb" if mode == "wb" else "x", **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        name_the_file(error, path)
        raise


def disk_error(error: BaseException | None) -> OSError | None:
    """The OSError "no space left on device" (or "disk quota exceeded") behind `error`, if any:
    itself, or in its chain (torch.save's RuntimeError "enforce fail at inline_container" follows
    the OSError that caused it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


def name_the_file(error: BaseException, path) -> None:
    """A write to an open file that runs out of space raises an OSError without a file name:
    give it the name of the file that was being written, for the message (jobs.py)."""
    full = disk_error(error)
    if full is not None and full.filename is None:
        full.filename = str(path)


def atomic_write(path, content: str | bytes) -> Path:
    """Write text (UTF-8) or bytes to `path` atomically; returns the path."""
    with atomic_file(path, "wb") as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(path)


def write_json(path, payload) -> Path:
    """`payload` as indented strict JSON (RFC 8259), atomically: every file the project writes goes through
    here. A number that is not finite (a statistic that could not be computed: a standard error of one
    target, a rate of no time) is written as null, since NaN and Infinity are not JSON and jq, a browser's
    JSON.parse and most readers refuse the whole file for one; the writer of such a figure says why beside it."""
    return atomic_write(path, json.dumps(finite_or_null(payload), indent=2, allow_nan=False) + "\n")


def finite_or_null(value):
    """`value` with every float that is not finite replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def read_json(path):
    """The JSON in `path`, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
