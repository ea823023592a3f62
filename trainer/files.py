"""Durable file writes: the one definition of "write atomically" for every package.

A reader sees the old content or the new, never a torn file: data goes to a
temporary sibling, is fsynced, and replaces the target with one rename (the
directory is fsynced too, so the rename survives a crash). Never writes
anywhere but next to the target.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_fsynced(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` and fsync it before returning."""
    with open(path, "wb") as f:
        f.write(data)
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
