"""Writing files so that nobody ever sees half of one: every file someone may read while it is written goes
through `atomic_file` (a temporary file beside it, flushed, renamed over it), so a reader, a second writer or a
kill sees the old file or the new one. Appends (history.csv) and a process's own logs are written directly.
"""

import errno
import json
import math
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

TMP_SUFFIX = ".tmp"


def leftover_temporaries(folder: Path, name: str = "*") -> list[Path]:
    """Temporary files of writes that were cut short (by a kill) in `folder`, for targets matching `name`."""
    return sorted(Path(folder).glob(f".{name}.*{TMP_SUFFIX}"))


@contextmanager
def atomic_file(path) -> Iterator[BinaryIO]:
    """A temporary file to write that replaces `path` on success, with the usual permissions (not mkstemp's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")  # unique, hidden
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        full = disk_error(error)
        if full is not None and full.filename is None:  # a full disk's error on an open file names none
            full.filename = str(path)
        raise


def disk_error(error: BaseException | None) -> OSError | None:
    """The OSError "no space left on device" (or "disk quota exceeded") that is `error` or in its chain."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


def atomic_write(path, content: str | bytes) -> Path:
    with atomic_file(path) as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(path)


def write_json(path, payload) -> Path:
    """`payload` as indented strict JSON, atomically: a number that is not finite is written as null (NaN is not
    JSON, and most readers refuse the whole file for one)."""
    return atomic_write(path, json.dumps(finite_or_null(payload), indent=2, allow_nan=False) + "\n")


def finite_or_null(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


# (magic bytes, format, the command that decompresses it) of compressed files a user may give as text
COMPRESSED = ((rb"\x1f\x8b", "gzip", "gunzip -k"), (rb"BZh[1-9]1AY&SY", "bzip2", "bunzip2 -k"),
              (rb"PK\x03\x04", "zip", "unzip"), (rb"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
              (rb"\xfd7zXZ\x00", "xz", "unxz -k"))


def utf8_text(data: bytes) -> str:
    """`data` decoded as UTF-8 (a byte-order mark dropped, as Python's utf-8-sig reads it); else a ValueError saying
    how it is not, as a user can act on it: UTF-16, or the first byte that is not UTF-8 (its offset and line), with
    the conversion that fixes it."""
    head = data[:4096]
    for magic, kind, undo in COMPRESSED:  # a compressed file is no text in another encoding: iconv would not help
        if re.match(magic, head):
            raise ValueError(f"it is a {kind}-compressed file, not text; decompress it first, e.g. {undo} FILE (a "
                             "corpus, data.path, may be .xz as it is)")
    if looks_utf16(data):
        raise ValueError("it looks like UTF-16 (a byte-order mark, or a NUL byte every other byte); convert it first, "
                         "e.g. iconv -f utf-16 -t utf-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(f"byte 0x{data[err.start]:02x} at offset {err.start}, line {line}; convert it first, e.g. "
                         "iconv -f latin1 -t utf-8") from None


def looks_utf16(data: bytes) -> bool:
    """A UTF-16 byte-order mark, or a NUL byte every other byte, in the first 4 KiB (valid UTF-8 all the same)."""
    head = data[:4096]
    return head[:2] in (b"\xff\xfe", b"\xfe\xff") or head.count(b"\x00") > len(head) // 4


def read_json(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
