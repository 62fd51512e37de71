"""Read back what a W&B run logged, from its local `run-<id>.wandb` file (tests only).

W&B 0.31 keeps an offline run in that one binary file (no wandb-summary.json) and offers no
local reader, so the tests decode it: a LevelDB-style log (a 7-byte header ":W&B", 0xBEE1,
version; then 32 KiB blocks of chunks with a 7-byte header: crc32, length, type) whose
records are wandb's own protobuf `Record` messages (wandb.proto.wandb_internal_pb2).
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class RunRecords:
    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    history: list[dict] = field(default_factory=list)  # one dict per wandb.log call
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the run's config, as logged (plain nested values)
    exit_code: int | None = None

    def series(self, key: str) -> list:
        return [row[key] for row in self.history if key in row]


def _records(data: bytes):
    from wandb.proto import wandb_internal_pb2

    assert data[:4] == b":W&B", "not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # zero padding up to the next block
            pos += (BLOCK - pos % BLOCK) % BLOCK
            continue
        pending += data[pos:pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _items(items) -> dict:
    """{key: value}; media (tables, images) come as nested keys and become nested dicts."""
    out: dict = {}
    for item in items:
        path = [item.key] if item.key else list(item.nested_key)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = json.loads(item.value_json)
    return out


def read_run(wandb_file: Path) -> RunRecords:
    run = RunRecords()
    for record in _records(Path(wandb_file).read_bytes()):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name, run.group = record.run.run_id, record.run.display_name, record.run.run_group
            run.job_type = record.run.job_type
            run.config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            run.config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(folder: Path, wait: float = 30.0) -> list[RunRecords]:
    """Every offline run under folder/wandb/, each read once its exit record is on disk: wandb.finish
    can return while W&B's service process is still writing the file. After `wait` seconds (a
    killed run never gets one) the runs are returned as they are."""
    deadline, runs = time.monotonic() + wait, []
    while True:
        try:
            runs = [read_run(path) for path in sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb"))]
            if all(run.exit_code is not None for run in runs):
                return runs
        except Exception:  # a file still being written (no header yet, half a record)
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            return runs
        time.sleep(0.2)
