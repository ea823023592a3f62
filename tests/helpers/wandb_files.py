"""The points a W&B run's offline `.wandb` file holds, read with W&B's own record definitions.

The file is W&B's transaction log: a 7-byte header (":W&B", a magic and a version), then LevelDB's log framing (32 KiB
blocks; each chunk a 7-byte header of checksum, length and type, a record split over blocks as first, middle, last)
around protobuf `Record`s from `wandb.proto.wandb_internal_pb2`. W&B 0.31 ships no Python reader of its own; this
reads only the framing and leaves each record to W&B's protobuf. A chunk cut short (a kill mid-write) ends the read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

HEADER, BLOCK, CHUNK_HEADER = 7, 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", f"not a W&B transaction log: it starts {data[:8]!r}"
    pos, pieces = HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        if kind == 0 or len(chunk) < length:
            return
        pos += CHUNK_HEADER + length
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            yield pieces


def history(path: Path) -> list[tuple[int, dict]]:
    """Each history row the file holds, in order: (step, {key: value}) with W&B's own keys (`_step`, ...) left out."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for payload in _payloads(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        # W&B 0.31 names a key in `nested_key` (one part for a flat key); older files in `key`.
        items = {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = items.pop("_step", record.history.step.num)
        rows.append((int(step), {key: value for key, value in items.items() if not key.startswith("_")}))
    return rows


def offline_runs(directory: Path) -> list[Path]:
    """The `.wandb` file of each offline run under `directory`'s `wandb/` folder, oldest first (W&B names a run's
    folder by its start time)."""
    return [next(run.glob("run-*.wandb")) for run in sorted((directory / "wandb").glob("offline-run-*"))]
