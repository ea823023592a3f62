"""What a Session tells the world: the events it emits, its progress, the trajectory log and rank 0's voice.

Every event goes through `Telemetry.emit`, the one place where the payloads
are shaped (so that a shared event vocabulary can replace them there); the
payloads are plain dicts. This module must never decide anything about the
run: it only reports what the other objects did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from legato.errors import ResumeMismatchError
from legato.events import Kind, loop_left_label
from legato.session.losses import Loss, Rate, hex_of, number
from legato.state.hashing import rank_hash
from legato.store.commit import Committed
from legato.store.trajectory import TrajectoryWriter
from legato.voice import say

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 1.0
ERROR_CHARS = 300  # of an exception's text in a LOOP_LEFT record: enough to name it, never a whole traceback


def error_text(error: BaseException) -> str:
    """An exception in one line: its type, its message's first line and, where the message runs on (a DataLoader worker's
    exception carries the worker's traceback), its last line, which names the original error."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if len(lines) > 1:
        text += f" ... {lines[-1]}"
    return text[:ERROR_CHARS]


class Telemetry:
    """One rank's events, progress reports and trajectory log."""

    def __init__(self, rank: int, total_steps: int, on_event: Callable[[dict], None] | None) -> None:
        self.rank, self.total_steps = rank, total_steps
        self.on_event = on_event or (lambda event: None)
        self._trajectory: TrajectoryWriter | None = None
        self._last_progress_time = 0.0

    def emit(self, event: Kind, **fields: Any) -> None:
        """Hand one event to the caller: {"event": ..., "rank": ..., **fields}."""
        self.on_event({"event": event, "rank": self.rank, **fields})

    def say(self, message: str, *args: Any) -> None:
        """A line a person must see (rank 0 only, even without logging configured)."""
        say(log, self.rank, message, *args)

    def open_trajectory(self, path: Path, resume_step: int) -> None:
        """Start the trajectory log, cut back to the step the run resumes from; steps an earlier attempt trained past
        it (and a kill lost) are reported as `WORK_LOST`."""
        self._trajectory = TrajectoryWriter(path, resume_step)
        lost_to = self._trajectory.dropped_to
        if lost_to is not None:
            self.emit(Kind.WORK_LOST, step=resume_step, trained_to=lost_to, lost_steps=lost_to - resume_step)

    def record(self, step: int, epoch: int, loss: Loss | None, lr: Rate | None, components: dict[str, str] | None) -> None:
        """One step's trajectory line; with `components`, the rank's state hash and digests too."""
        record: dict[str, Any] = {"step": step, "epoch": epoch, "loss_hex": hex_of(loss), "lr": lr}
        if components is not None:
            record["state_hash"] = rank_hash(components)
            record["components"] = components
        assert self._trajectory is not None
        self._trajectory.write(record)

    def flush(self) -> None:
        """Write out the trajectory's pending lines, reading the values the device computed for them; no wait on the disk."""
        assert self._trajectory is not None
        self._trajectory.flush()

    def sync(self) -> None:
        """Make the trajectory durable up to now (before a checkpoint that covers it)."""
        assert self._trajectory is not None
        self._trajectory.sync()

    def progress(self, step: int, epoch: int, loss: Loss | None) -> None:
        """At most once a second (and at the last step), rank 0 tells the caller how far it got."""
        now = time.monotonic()
        if self.rank != 0 or (now - self._last_progress_time < PROGRESS_INTERVAL_S and step < self.total_steps):
            return
        self._last_progress_time = now
        self.emit(Kind.PROGRESS, step=step, total_steps=self.total_steps, epoch=epoch, loss=number(loss))

    def committed(self, committed: Committed, reason: str, background: bool = False) -> None:
        """A published checkpoint (`background`: written while the loop trained on)."""
        optional: dict[str, Any] = {"diverged": {str(r): t for r, t in committed.diverged.items()}} if committed.diverged else {}
        if background:
            optional["background"] = True
        if committed.replays_from is not None:
            optional["replays_from"] = committed.replays_from
        self.emit(
            Kind.CHECKPOINT_COMMITTED,
            reason=reason,
            step=committed.step,
            global_hash=committed.global_hash,
            seconds=committed.seconds,
            bytes=committed.bytes,
            **optional,
        )

    def stop_agreed(self, step: int, received_at: float | None, **extra: Any) -> None:
        """The ranks agreed to stop after `step`."""
        self.emit(Kind.STOP_AGREED, step=step, signal_received_at=received_at, **extra)

    def loop_left(self, step: int, checkpoint_step: int | None, exc: BaseException) -> None:
        """The loop was left before the run's end: by an exception out of the step (a loader's too), or by GeneratorExit (a
        `break`, or an exception in the loop's body, which closes the generator as a break does). A failed verification is
        recorded by the resume's own verdict."""
        if isinstance(exc, ResumeMismatchError):
            return
        text = None if isinstance(exc, GeneratorExit) else error_text(exc)
        record = {"step": step, "total_steps": self.total_steps, "checkpoint_step": checkpoint_step, "exception": text}
        if text is None:  # an exception is shown by its own traceback
            self.say("rank %d: %s", self.rank, loop_left_label(record))
        self.emit(Kind.LOOP_LEFT, **record)

    def already_complete(self, step: int, global_hash: str) -> None:
        """The attempt resumed a run whose training is done (relaunched once more, or given a shorter total_steps): it
        trains nothing, and ends as the run's last attempt did, finished."""
        self.say("rank %d: the run is already complete at step %d (total_steps=%d); nothing to train", self.rank, step, self.total_steps)
        self.emit(Kind.FINISHED, step=step, final_global_hash=global_hash)

    def close(self) -> None:
        """Close the trajectory log."""
        if self._trajectory is not None:
            self._trajectory.close()
            self._trajectory = None
