"""A corpus's token ids, prepared once into `ids-<key>.bin` and memory-mapped (as nanoGPT's data/*/prepare.py): a run
costs the corpus's pages, not 8 bytes a token. The file, its record and its key: docs/configuration.md, *tokenizer*."""

import hashlib
import json
import mmap
import shutil
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from gru_experiments.errors import UserError
from gru_experiments.files import atomic_file, disk_error, read_json, write_json

FORMAT_VERSION = 1  # bump when what a file holds for the same key changes
WIDTHS = (np.uint8, np.uint16, np.int32)  # the smallest that holds the vocabulary


def ids_dtype(vocab_size: int) -> np.dtype:
    return next(np.dtype(t) for t in WIDTHS if vocab_size - 1 <= np.iinfo(t).max)


def ids_key(corpus_sha256: str, tokenizer_settings: dict, train_fraction: float, test_fraction: float = 0) -> str:
    """What the ids are a function of: the text, the tokenizer's settings (it is fitted on that text) and the cuts
    (no test split: the key it had before there were test splits, so that prepared files stay valid)."""
    cuts = {"train_fraction": train_fraction} | ({"test_fraction": test_fraction} if test_fraction else {})
    source = json.dumps({"version": FORMAT_VERSION, "sha256": corpus_sha256, "tokenizer": tokenizer_settings,
                         **cuts}, sort_keys=True)
    return hashlib.sha256(source.encode()).hexdigest()[:32]


@dataclass
class PreparedIds:
    """A prepared corpus: its tokenizer's state, the splits' lengths and the mapped ids (train, validation, test)."""
    tokenizer_state: dict
    n_train: int
    n_val: int
    ids: torch.Tensor  # (n_train + n_val + n_test,) of the file's dtype, mapped read-only (copy on write)
    record: dict
    n_test: int = 0

    @property
    def train_ids(self) -> torch.Tensor:
        return self.ids[:self.n_train]

    @property
    def val_ids(self) -> torch.Tensor:
        return self.ids[self.n_train:self.n_train + self.n_val]

    @property
    def test_ids(self) -> torch.Tensor:
        return self.ids[self.n_train + self.n_val:]


class IdsFile:
    """`ids-<key>.bin` and its record `ids-<key>.json` in `folder`."""

    def __init__(self, folder: str | Path, key: str):
        self.folder = Path(folder)
        self.bin, self.record_file = self.folder / f"ids-{key}.bin", self.folder / f"ids-{key}.json"
        self.key = key

    def lock(self) -> FileLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.bin) + ".lock")

    def problem(self, record, corpus_sha256: str) -> str | None:
        """Why the file on disk is not this key's ids by its `record` (None: it is; "" : there is none)."""
        if record is None and not self.bin.exists():
            return ""
        if not isinstance(record, dict) or record.get("version") != FORMAT_VERSION:
            return "its record is missing or unreadable"
        if record.get("sha256") != corpus_sha256 or record.get("key") != self.key:
            return f"it records another corpus or tokenizer (sha256 {record.get('sha256')})"
        expected = length(record) * np.dtype(record["dtype"]).itemsize
        if not self.bin.exists() or (size := self.bin.stat().st_size) != expected:
            return f"it holds {size if self.bin.exists() else 0:,} bytes, not the {expected:,} its record says"
        return None

    def load(self, record: dict) -> PreparedIds:
        """The ids its `record` vouches for, mapped."""
        dtype, n = np.dtype(record["dtype"]), length(record)
        if self.largest_id(dtype, n) >= record["vocab_size"]:  # bytes changed under the record: never trained on
            raise DamagedIds(f"it holds an id past the vocabulary of {record['vocab_size']}")
        mapped = np.zeros(0, dtype)
        if n:  # copy on write (nothing writes it): torch wants a writable buffer
            with open(self.bin, "rb") as f:
                region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            mapped = np.frombuffer(region, dtype=dtype, count=n)
            _MAPS.append((weakref.ref(region), mapped.ctypes.data, mapped.nbytes))
        return PreparedIds(record["tokenizer"], record["n_train"], record["n_val"], torch.from_numpy(mapped), record,
                           record.get("n_test", 0))

    def largest_id(self, dtype: np.dtype, n: int, chunk: int = 1 << 24) -> int:
        """The file's largest id, read a chunk at a time (not through the map: the check leaves no page resident)."""
        largest = -1
        with open(self.bin, "rb") as f:
            for start in range(0, n, chunk):
                largest = max(largest, int(np.fromfile(f, dtype=dtype, count=min(chunk, n - start)).max()))
        return largest

    def write(self, chunks, record: dict) -> dict:
        """The ids from `chunks` (numpy arrays of ids, in order), then the record that vouches for them (returned)."""
        needed = length(record) * np.dtype(record["dtype"]).itemsize
        self.folder.mkdir(parents=True, exist_ok=True)
        if (free := shutil.disk_usage(self.folder).free) < needed:
            raise UserError(f"no room for the corpus's token ids: {needed:,} bytes needed in {self.folder}, "
                            f"{free:,} free; free some space, or give another paths.data_dir")
        try:
            with atomic_file(self.bin) as out:
                for chunk in chunks:
                    out.write(np.ascontiguousarray(chunk, dtype=record["dtype"]).tobytes())
        except OSError as error:
            if disk_error(error) is None:
                raise
            raise UserError(f"the disk filled while writing the corpus's token ids to {self.bin} ({error}); nothing "
                            "was kept: free some space, or give another paths.data_dir") from None
        record = {"version": FORMAT_VERSION, "key": self.key, **record}
        write_json(self.record_file, record)
        return record


_MAPS: list = []  # (weak reference, address, bytes) of each ids file mapped here: release_pages finds its tensor's


def release_pages(ids: torch.Tensor) -> None:
    """The whole pages of `ids` given back to the kernel where it views a mapped ids file: a pass reading a split in
    chunks then holds one chunk's pages, not the split's (they are the file's: a later read maps them again)."""
    start, end = ids.data_ptr(), ids.data_ptr() + ids.numel() * ids.element_size()
    for entry in list(_MAPS):
        ref, base, size = entry
        region = ref()
        if region is None:  # its tensors are gone, and the map with them
            _MAPS.remove(entry)
        elif base <= start and end <= base + size:
            first = -(-(start - base) // mmap.PAGESIZE) * mmap.PAGESIZE
            last = (end - base) // mmap.PAGESIZE * mmap.PAGESIZE
            if last > first and hasattr(mmap, "MADV_DONTNEED"):  # (not on Windows: the pages stay)
                region.madvise(mmap.MADV_DONTNEED, first, last - first)
            return


def length(record: dict) -> int:
    """The ids a record vouches for: every split's (a record from before test splits has none)."""
    return record["n_train"] + record["n_val"] + record.get("n_test", 0)


class DamagedIds(ValueError):
    """An ids file whose bytes its record does not vouch for."""


def prepared_ids(folder: str | Path, key: str, corpus_sha256: str, prepare, source: Path) -> PreparedIds:
    """The ids of `key`, mapped, prepared first (`prepare(ids_file)` returns their record) where none match their
    record; under the file's lock, so a second run waits and maps the first's. `source`: the corpus file, said in a
    line where its ids were prepared when it held another text."""
    ids_file = IdsFile(folder, key)
    with ids_file.lock():
        record = read_json(ids_file.record_file)
        problem = ids_file.problem(record, corpus_sha256)
        if problem is None:
            try:
                return ids_file.load(record)
            except DamagedIds as error:
                problem = str(error)
        records = (read_json(path) for path in sorted(ids_file.folder.glob("ids-*.json")))
        if edited := next((r["sha256"] for r in records if isinstance(r, dict) and r.get("source") == str(source)
                           and r.get("sha256") not in (None, corpus_sha256)), None):
            print(f"corpus {source} changed since its token ids were prepared (sha256 {edited}, now {corpus_sha256}): "
                  "its ids are prepared anew")
        if problem:
            print(f"the token ids in {ids_file.bin} do not match their record ({problem}): preparing them again")
        started = time.perf_counter()
        prepared = ids_file.load(prepare(ids_file))
        print(f"prepared the token ids of {prepared.record.get('source')} ({prepared.ids.numel():,} tokens, "
              f"{prepared.ids.dtype}) in {time.perf_counter() - started:.1f} s: {ids_file.bin}")
        return prepared
