"""The run's append-only event log, `<run_dir>/ledger.jsonl`, as the supervisor and the job side write it.

Written by the supervisor and by rank 0 of every attempt (the job side reaches
it through the same file, never through the supervisor's memory). The file
format (locked, fsynced appends; torn lines skipped) is `legato.ledger_file`;
the kinds and their fields are `legato.events`. What this adds is redaction:
error messages can quote values, and none may land on disk as a secret. This
module must never rewrite or truncate the file: history is only added to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from legato.events import Kind
from legato.ledger_file import append_record, new_record, read_records
from legato.paths import RunPaths
from legato.repro.redact import Redactor

_REDACTOR = Redactor()


class Ledger:
    """One run directory's ledger: append events, read them back."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = RunPaths(self.run_dir).ledger

    def exists(self) -> bool:
        return self.path.is_file()

    def append(self, event: Kind, **fields: Any) -> dict:
        """Append one event (with its wall-clock time) durably; returns the record written."""
        record = new_record(event, fields)
        append_record(self.run_dir, record, _REDACTOR.text)
        return record

    def read(self) -> list[dict]:
        """Every complete event, oldest first; unreadable lines (a torn write) are skipped."""
        return read_records(self.run_dir)
