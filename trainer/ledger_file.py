"""The ledger's file format: `<run_dir>/ledger.jsonl`, one JSON record per line, only ever appended to.

Every append happens under the run's ledger lock (`filelock`) and is fsynced,
so concurrent writers (the supervisor, every rank) never interleave and a
written record survives a crash. An append that fails (a full disk) takes back
the part of its own record it wrote; a line torn by a crash is skipped when
reading, never fatal, and the next append starts on a fresh line. This is the
core's half of the ledger, so that a Session can record into it without the
orchestrator; `legato.orchestrator.ledger.Ledger` adds redaction on top. It
must never rewrite or truncate what was written before: history is only added to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock

from legato.events import Kind
from legato.paths import RunPaths

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 60


def new_record(event: Kind | str, fields: dict[str, Any]) -> dict:
    """A ledger record: the event's kind, its wall-clock time, and its fields."""
    return {"event": event, "time": round(time.time(), 3), **fields}


def append_record(run_dir: str | Path, record: dict, scrub: Callable[[str], str] = str) -> None:
    """Append `record` as one line, durably; `scrub` may rewrite the line's text (redaction) before it is written."""
    paths = RunPaths(run_dir)
    line = scrub(json.dumps(record, sort_keys=True, default=str)) + "\n"
    paths.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(paths.ledger_lock), timeout=LOCK_TIMEOUT_S):
        fd = os.open(paths.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            data = (b"\n" if start > 0 and not _ends_with_newline(paths.ledger) else b"") + line.encode()
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                # A full disk: the part of this record that was written goes again, so no reader meets half a line.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def record(run_dir: str | Path, event: Kind, **fields: Any) -> dict:
    """Append one event of `event`'s kind to the run's ledger; returns the record written."""
    written = new_record(event, fields)
    append_record(run_dir, written)
    return written


def read_records(run_dir: str | Path) -> list[dict]:
    """Every complete record, oldest first; unreadable lines (a torn write) are skipped."""
    try:
        lines = RunPaths(run_dir).ledger.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return list(parse_lines(lines))


def parse_lines(lines: Iterable[bytes]) -> Iterable[dict]:
    """The records among raw ledger lines, skipping blank, torn and foreign ones."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            parsed = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ledger line %d is incomplete or corrupt (a write cut short); skipping it", number)
            continue
        if isinstance(parsed, dict) and "event" in parsed:
            yield parsed


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
