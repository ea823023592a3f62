"""What a Session records in its run's ledger when nothing listens to it: the proof of every resume.

Under `legato run` the Session reports to the job side, which writes the
ledger with its job tag. A Session in a user's own script (launched by
torchrun, srun or a shell) has no such listener; `LedgerRecorder` is then its
`on_event`, so that `legato verify --command` reads each resume and its
verdict (hashes, replay), and the state legato does not save, from records,
never from a log line. Only rank 0
records, with the same fields as the job side minus the job tag. It must
never record the trainer's other reports (progress, stop agreement), and never
be used beside a listener that writes the ledger itself (each resume would be
recorded twice).
"""

from __future__ import annotations

from pathlib import Path

from legato.events import JOB_TAG_FIELDS, Kind, field_names
from legato.ledger_file import record

RECORDED = (Kind.RESUMED, Kind.REPLAY_STOPPED, Kind.UNSAVED_STATE)


class LedgerRecorder:
    """An `on_event` callback that appends rank 0's resumes (and stops during a replay) to `<run_dir>/ledger.jsonl`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def __call__(self, event: dict) -> None:
        kind = event.get("event")
        if kind not in RECORDED or event.get("rank", 0) != 0:
            return
        kind = Kind(kind)
        fields = {name: event.get(name) for name in sorted(field_names(kind) - JOB_TAG_FIELDS)}
        record(self.run_dir, kind, **fields)
