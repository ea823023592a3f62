"""Durable file writes: the one definition of "write atomically" for every package.

A reader sees the old content or the new, never a torn file: data goes to a
temporary sibling, is fsynced, and replaces the target with one rename (the
directory is fsynced too, so the rename survives a crash). Big buffers reach
the file in pieces (`write_in_pieces`). Never writes anywhere but next to the
target. Also the one reader of files appended a JSON line at a time
(`read_json_lines`: trajectories, the ranks' pace), which leaves out a line a
crash tore.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO

# A buffer reaches a file in pieces of at most this size. Measured on this project's machines (virtual machines that give
# freed memory back to their host: virtio-balloon free page reporting), once memory has settled a write() of 2 MiB or
# more costs 4-5x the time of smaller ones, page cache filled in 2 MiB folios being the likely cause: 256 MiB written and
# fsynced took 0.20-0.23 s in 256 KiB pieces and 0.78-0.83 s in one write (docs/benchmarks-log.md, "Writes in pieces",
# 2026-11-25). Elsewhere a
# piece costs one system call per 256 KiB.
WRITE_PIECE_BYTES = 256 * 1024


def write_in_pieces(f: BinaryIO, data: bytes | memoryview) -> int:
    """Write `data` to `f` in pieces of at most WRITE_PIECE_BYTES; returns the bytes written."""
    view = memoryview(data).cast("B")
    for start in range(0, view.nbytes, WRITE_PIECE_BYTES):
        f.write(view[start : start + WRITE_PIECE_BYTES])
    return view.nbytes


def write_fsynced(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` and fsync it before returning."""
    with open(path, "wb") as f:
        write_in_pieces(f, data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Fsync the directory `path`, so that entries created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, durable: bool = True) -> None:
    """Replace `path` with `data` (text is UTF-8) in one atomic step; `durable` also survives a crash
    (fsyncs), which a display-only file written every second on the training path can skip."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    if durable:
        write_fsynced(tmp, raw)
    else:
        tmp.write_bytes(raw)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def read_json_lines(path: Path) -> list[dict]:
    """Every complete line of a file appended to one JSON line at a time; a torn last line (a crash) and what follows a
    line that does not parse are left out. [] when the file is missing."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records
