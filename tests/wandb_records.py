"""Read back what W&B wrote to an offline run's .wandb file (for tests).

The file is W&B's record log: a 7-byte header (":W&B", magic, version), then LevelDB-style
framing in 32 KiB blocks (per fragment: crc32 4 bytes, length 2, type 1) around protobuf Records.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B record file"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        fragment = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = fragment if kind in (FULL, FIRST) else pending + fragment
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_run(run_dir: Path) -> dict:
    """{'id', 'group', 'config': {...}, 'summary': {...}, 'history': [{...}, ...]} of an offline run folder."""
    (wandb_file,) = Path(run_dir).glob("*.wandb")
    run = {"config": {}, "summary": {}, "history": []}
    for record in records(wandb_file):
        which = record.WhichOneof("record_type")
        if which == "run":
            run["id"], run["group"] = record.run.run_id, record.run.run_group
            for item in record.run.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif which == "config":
            for item in record.config.update:
                run["config"][item.key] = json.loads(item.value_json)
        elif which == "summary":
            for item in record.summary.update:
                run["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif which == "history":
            run["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                   for item in record.history.item})
    return run
