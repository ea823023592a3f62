"""The job side's ledger voice: the trainer's events of one rank, as the run's ledger records them.

Rank 0 records the attempt's story (checkpoints, resumes, work lost, the census's warnings, its progress file);
every rank records its own stop signal and a hang it found. It must never decide anything about the job (requeue,
exit code: `legato.orchestrator.jobside`) nor write anywhere but the ledger and the progress file.
"""

from __future__ import annotations

from pathlib import Path

from legato.event_fields import JOB_TAG_FIELDS, field_names
from legato.events import Kind
from legato.orchestrator.ledger import Ledger
from legato.recorder import ProgressFile


class JobEvents:
    """Turns the trainer's events into ledger records (rank 0, plus each rank's own stop signal); `tag`: the job's
    fields every record carries (`Identity.tag`), `rank`: this rank."""

    def __init__(self, ledger: Ledger, tag: dict, rank: int, progress_path: Path) -> None:
        self.ledger = ledger
        self.tag, self.rank = tag, rank
        self.progress = ProgressFile(progress_path, tag)
        self.last_step = 0
        self.final_hash: str | None = None
        self.error: str | None = None
        self.peer_lost = False

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        self.last_step = max(self.last_step, int(event.get("step") or 0))
        if kind == Kind.STOP_AGREED and event.get("signal_received_at") is not None:
            at_start = bool(event.get("at_start"))
            self.ledger.append(
                Kind.STOP_SIGNAL,
                **self.tag,
                rank=self.rank,
                step=event["step"],
                received_at=event["signal_received_at"],
                at_start=at_start,
            )
        if kind == Kind.HANG:  # from whichever rank found it, which then exits; the supervisor resubmits or ends the run
            fields = {k: event.get(k) for k in sorted(field_names(Kind.HANG) - JOB_TAG_FIELDS)}
            self.ledger.append(Kind.HANG, **self.tag, **fields)
        if self.rank != 0:
            return
        if kind == Kind.PROGRESS:
            self.progress.write(event)
        elif kind == Kind.CHECKPOINT_COMMITTED:
            if event["reason"] == "final":
                self.final_hash = event["global_hash"]
            fields = {k: event[k] for k in ("step", "global_hash", "seconds", "bytes", "reason")}
            fields.update({k: event[k] for k in ("diverged", "replays_from", "background") if event.get(k) is not None})
            self.ledger.append(Kind.CHECKPOINT_COMMITTED, **self.tag, **fields)
        elif kind in (Kind.RESUMED, Kind.CONTINUED_UNVERIFIED, Kind.WORK_LOST, Kind.CHECKPOINT_INTERVAL):
            fields = {k: event.get(k) for k in sorted(field_names(kind) - JOB_TAG_FIELDS)}
            self.ledger.append(kind, **self.tag, **fields)
        elif kind == Kind.CHECKPOINT_FAILED:
            fields = {k: event[k] for k in sorted(field_names(Kind.CHECKPOINT_FAILED) - JOB_TAG_FIELDS)}
            self.ledger.append(Kind.CHECKPOINT_FAILED, **self.tag, **fields)
            if event["reason"] == "final":
                self.error = event["message"]
        elif kind == Kind.REPLAY_STOPPED:
            self.ledger.append(Kind.REPLAY_STOPPED, **self.tag, step=event["step"], checkpoint_step=event["checkpoint_step"])
        elif kind == Kind.BUCKET_LAYOUT:
            self.ledger.append(Kind.BUCKET_LAYOUT, **self.tag, step=event["step"], pinned=event["pinned"], reason=event["reason"])
        elif kind == Kind.FINISHED:  # the attempt found the run already complete (a requeue after the end)
            self.final_hash = event["final_global_hash"]
        elif kind == Kind.UNSAVED_STATE:
            fields = {k: event.get(k) for k in sorted(field_names(Kind.UNSAVED_STATE) - JOB_TAG_FIELDS)}
            self.ledger.append(Kind.UNSAVED_STATE, **self.tag, **fields)
        elif kind == Kind.ERROR:
            self.error = event["message"]
            self.peer_lost = bool(event.get("peer_lost"))
