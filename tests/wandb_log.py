"""Read back an offline wandb run (`run-*.wandb`) for tests: its history rows and config.

The file is wandb's LevelDB-style record log: a 7-byte file header (':W&B', magic, version), then
32 KiB blocks of records, each with a 7-byte header (crc32, length, type: full/first/middle/last);
each record is a serialized `wandb_internal_pb2.Record`. The wandb SDK no longer ships a Python
reader (its core is in Go), hence this small one.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(data: bytes):
    assert data[:4] == b":W&B", "not a wandb run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # block tail too short for a header: zero padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:  # zeros at the end of the file
            return


def read_run(path: Path) -> tuple[list[dict], dict]:
    """(history rows, config) of one offline run file."""
    history, config = [], {}
    for raw in _records(path.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
        elif kind in ("config", "run"):  # the run record carries the initial config
            updates = rec.config.update if kind == "config" else rec.run.config.update
            for i in updates:
                config[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return history, config
