"""What a Session records in its run directory when nothing listens to it: the run as `legato status` reads it.

Under `legato run` the Session reports to the job side, which writes the
ledger with its job tag. A Session in a user's own script (launched by
torchrun, srun or a shell) has no such listener; `LedgerRecorder` is then its
`on_event`, so that `legato status`, `watch`, `plot` and `verify --command`
read the script's run from records, never from a log line: rank 0's
checkpoints, resumes and their verdicts (hashes, replay), its bucket layout, the state legato does not save,
how the attempt ended (`ATTEMPT_STOPPED` at a stop checkpoint, `FINISHED` at the
final one, or at once where the run was already complete, `LOOP_LEFT` after a
`break` or an exception), each rank's stop signal, and rank 0's progress in progress.json
(`ProgressFile`, the job side's too). Records carry the attempt's job tag
(`legato.session.identity`) when given one. It must never be used beside a
listener that writes the ledger itself (every record would be written twice).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from legato.errors import EXIT_FAILED
from legato.event_fields import JOB_TAG_FIELDS, field_names
from legato.events import Kind, repeated_hang_reason
from legato.files import write_atomic
from legato.ledger_file import record
from legato.paths import RunPaths

log = logging.getLogger(__name__)

RECORDED = (
    Kind.CHECKPOINT_COMMITTED,
    Kind.CHECKPOINT_FAILED,
    Kind.RESUMED,
    Kind.CONTINUED_UNVERIFIED,
    Kind.REPLAY_STOPPED,
    Kind.BUCKET_LAYOUT,
    Kind.UNSAVED_STATE,
    Kind.LOOP_LEFT,
    Kind.WORK_LOST,
    Kind.CHECKPOINT_INTERVAL,
)


class ProgressFile:
    """progress.json: rank 0's latest step, epoch, loss and rate since this attempt's first report, tagged with its attempt."""

    def __init__(self, path: Path, tag: dict) -> None:
        self.path, self.tag = path, tag
        self._first: tuple[float, int] | None = None
        self._unwritable = False

    def write(self, event: dict) -> None:
        """Replace the file with this `PROGRESS` report (not fsynced: it is only ever the latest reading)."""
        now = time.time()
        if self._first is None:
            self._first = (now, event["step"])
            self.path.parent.mkdir(parents=True, exist_ok=True)
        since, first_step = self._first
        rate = (event["step"] - first_step) / (now - since) if now > since else None
        reading = {**self.tag, **{k: event[k] for k in ("step", "total_steps", "epoch", "loss")}, "steps_per_s": rate, "time": now}
        try:
            write_atomic(self.path, json.dumps(reading), durable=False)
        except OSError as exc:
            # Only the live reading waits (a full disk): training goes on, and a checkpoint that fails says so itself.
            if not self._unwritable:
                log.warning("%s not updated: %s; the live reading waits until there is room", self.path.name, exc)
            self._unwritable = True


class LedgerRecorder:
    """An `on_event` callback that writes a script's run into `<run_dir>`: rank 0's records and progress, each rank's stop."""

    def __init__(self, run_dir: str | Path, tag: dict | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.tag = dict(tag or {})
        self.progress = ProgressFile(RunPaths(self.run_dir).progress, self.tag)

    def __call__(self, event: dict) -> None:
        kind, rank = event.get("event"), event.get("rank", 0)
        if kind == Kind.STOP_AGREED:
            self._stop_agreed(event)
        if kind == Kind.HANG:  # from whichever rank found it, which then exits
            self._hang(event)
        if rank != 0:
            return
        if kind == Kind.PROGRESS:
            self.progress.write(event)
        elif kind in RECORDED:
            self._record(Kind(kind), event)
        if kind == Kind.CHECKPOINT_COMMITTED and event["reason"] == "final":
            self._write(Kind.FINISHED, step=event["step"], final_global_hash=event["global_hash"])
        elif kind == Kind.CHECKPOINT_COMMITTED and event["reason"] == "signal":
            self._write(Kind.ATTEMPT_STOPPED, step=event["step"])
        elif kind == Kind.REPLAY_STOPPED:
            self._write(Kind.ATTEMPT_STOPPED, step=event["checkpoint_step"])
        elif kind == Kind.CHECKPOINT_FAILED and event["reason"] == "signal":
            self._write(Kind.ATTEMPT_STOPPED, step=event["standing"] or 0)
        elif kind == Kind.FINISHED:  # an attempt that found the run already complete: no final checkpoint of its own
            self._write(Kind.FINISHED, step=event["step"], final_global_hash=event["final_global_hash"])

    def _stop_agreed(self, event: dict) -> None:
        """The rank the signal reached records it (as the job side does); a stop during start-up ends the attempt at once."""
        if event.get("signal_received_at") is not None:
            self._write(
                Kind.STOP_SIGNAL,
                rank=event["rank"],
                step=event["step"],
                received_at=event["signal_received_at"],
                at_start=bool(event.get("at_start")),
            )
        if event.get("at_start") and event.get("rank", 0) == 0:
            self._write(Kind.ATTEMPT_STOPPED, step=event["step"])

    def _hang(self, event: dict) -> None:
        """The hang, and, when it repeated an earlier attempt's, the run's end: its launcher must not run it again."""
        self._record(Kind.HANG, event)
        if event["repeated"]:
            self._write(Kind.FAILED, exit_code=EXIT_FAILED, reason=repeated_hang_reason(event))

    def _record(self, kind: Kind, event: dict) -> None:
        self._write(kind, **{name: event.get(name) for name in sorted(field_names(kind) - JOB_TAG_FIELDS)})

    def _write(self, kind: Kind, **fields: object) -> None:
        record(self.run_dir, kind, **self.tag, **fields)
