"""The run's append-only event log: `<run_dir>/ledger.jsonl`, one JSON object per line.

Written by the supervisor and by rank 0 of every attempt (the job side reaches
it through the same file, never through the supervisor's memory). Every append
happens under a `filelock` lock and is fsynced, so concurrent writers never
interleave and a committed event survives a crash. A line torn by a crash is
skipped when reading, never fatal, and the next append starts on a fresh line.
This module must never rewrite or truncate the file: history is only added to.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock

from legato.orchestrator.redact import Redactor
from legato.paths import RunPaths

log = logging.getLogger(__name__)

_REDACTOR = Redactor()


class Ledger:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        paths = RunPaths(self.run_dir)
        self.path = paths.ledger
        self._lock = FileLock(str(paths.ledger_lock), timeout=60)

    def exists(self) -> bool:
        return self.path.is_file()

    def append(self, event: str, **fields: Any) -> dict:
        """Append one event (with its wall-clock time) durably; returns the record written."""
        record = {"event": event, "time": round(time.time(), 3), **fields}
        # A last line of defence: error messages can quote values, and none may land on disk as a secret.
        line = _REDACTOR.text(json.dumps(record, sort_keys=True, default=str)) + "\n"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "ab") as f:
            if f.tell() > 0 and not _ends_with_newline(self.path):
                f.write(b"\n")
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        return record

    def read(self) -> list[dict]:
        """Every complete event, oldest first; unreadable lines (a torn write) are skipped."""
        return list(parse_lines(self._raw_lines()))

    def _raw_lines(self) -> list[bytes]:
        try:
            return self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []


def parse_lines(lines: Iterable[bytes]) -> Iterable[dict]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ledger line %d is incomplete or corrupt (a write cut short); skipping it", number)
            continue
        if isinstance(record, dict) and "event" in record:
            yield record


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
