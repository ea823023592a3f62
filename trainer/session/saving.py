"""Saving a run: what the ranks' agreement at a step boundary means for this rank, which driver writes the checkpoint
due, and the replay base it carries.

At each step boundary the loop has the ranks agree (legato.dist.stop) whether to stop or checkpoint, this rank voting
what `votes` says (its schedule's clock, legato.session.schedule; its replay base's; its background write's);
`reason` reads the agreed decision. A stop or the final step is written synchronously (legato.store.checkpoint), a
periodic one through the run's periodic writer (legato.store.writers: in the background when `checkpoint.async_` says
so, else synchronously too). The replay
base and the step records since it are legato.session.replay_base's; each checkpoint carries the base's share that
proves it. A stop checkpoint under verify "error" that has a base writes the base only: its state at step N is held by
its replay (the resume must replay B+1..N and the digests at N prove it), so the one checkpoint users wait on at the
time limit writes the state once.
This module must never call back into the Session and never restore anything.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from legato.config import CheckpointSection
from legato.dist.peers import Peers
from legato.dist.stop import NOTHING_AGREED, Decision
from legato.events import Kind
from legato.session.losses import Loss, Rate
from legato.session.position import Position
from legato.session.replay_base import ReplayBase
from legato.session.schedule import Schedule
from legato.session.telemetry import Telemetry
from legato.state import components as table
from legato.state.components import Component
from legato.state.hashing import Digests, rank_hash
from legato.state.snapshot import Snapshot
from legato.store import bases, layout
from legato.store import checkpoint as ckpt
from legato.store.async_checkpoint import AsyncCheckpointer, Job
from legato.store.commit import Committed, KillPoint, NotWritten
from legato.store.manifest import checkpoint_step, list_checkpoints
from legato.store.writers import Outcome, Synchronous, Writer

log = logging.getLogger(__name__)


class Saver:
    """One rank's checkpoints (what an agreement means, the writes) and the replay base with the step records since it."""

    def __init__(
        self,
        root: Path,
        peers: Peers,
        components: list[Component],
        position: Position,
        policy: CheckpointSection,
        telemetry: Telemetry,
        meta: dict[str, Any],
        kill: KillPoint | None,
        background: bool,
        failures: Callable[[], tuple[int, float]] = lambda: (0, 0.0),
    ) -> None:
        """`failures`: the run's unannounced failures, for `every_minutes: auto` (legato.session.schedule)."""
        self.root, self.peers, self.components, self.position = root, peers, components, position
        self.policy, self.telemetry, self.meta, self.kill = policy, telemetry, meta, kill
        self.periodic: Writer = (
            AsyncCheckpointer(root, peers.rank, peers.world_size, peers.group, policy.keep_last, kill) if background else Synchronous()
        )
        self.schedule = Schedule(policy, telemetry, peers.rank, failures)
        self.last_checkpoint: Committed | None = None
        self.unsaved_end = False  # the final checkpoint could not be written: the run is not done
        self.base = ReplayBase(policy, peers.rank)
        # Resharded from a stop checkpoint's replay base: the steps up to that checkpoint run again, and a checkpoint
        # among them would be older than the one that stands (never picked); none is written before it.
        self.standing = 0

    def take_snapshot(self) -> None:
        """Collective: make the current state the replay base, and agree how many steps pass before the next."""
        if not self.base.on:
            return
        # The copy's cost in this thread's CPU time: a rank descheduled on a busy node does not count the wait as cost.
        began = time.thread_time()
        self._copy_base()
        self.base.clock.spacing = self.peers.most(self.base.clock.wanted(self.position.step, time.thread_time() - began))

    def _copy_base(self) -> None:
        step = self.position.step
        # This step's state already staged for the checkpoint in flight becomes the replay base, and the old base's
        # buffer the next staging buffer.
        if self.periodic.lend_staged(step, self.base.adopt):
            return
        if self.base.snapshot is not None:
            self.periodic.release(self.base.snapshot)
        parts = table.capture(self.components)
        self.base.take(step, parts, *self._layout(parts))

    # -- checkpoints ----------------------------------------------------------

    def votes(self) -> dict[str, bool]:
        """This rank's side of a boundary's agreement (legato.dist.stop): a periodic checkpoint due by its clock, its
        replay base overdue, its background checkpoint still writing or failed."""
        return {"checkpoint_due_local": self.schedule.clock_due(), "base_due_local": self.base.clock.overdue(), **self.periodic.votes()}

    def reason(self, decision: Decision, total_steps: int) -> str | None:
        """What the ranks agreed at this boundary (`decision`) means here: why a checkpoint is due now, if one is."""
        self.base.agreed(decision)
        self._committed(self.periodic.settle(decision), "periodic", background=True)
        step = self.position.step
        if step == total_steps:
            return "final"
        if decision.stop:
            return "signal"
        if decision.checkpoint_due or self.schedule.due_by_steps(step):
            return "periodic"
        return None

    def next_due(self, step: int, total_steps: int) -> int:
        """The first step after `step` at which something may be due by steps: the last step, a periodic checkpoint or
        a state hash by their step counts, a replay base by its spacing. Before it, with no agreement read, `reason` is
        None and `step_end` a trajectory line: `quiet_end`."""
        counts = (self.policy.every_steps, self.policy.hash_every_steps, self.base.every if self.base.on else 0)
        return min([total_steps] + [(step // n + 1) * n for n in counts if n])

    def quiet_end(self, loss: Loss | None, lr: Rate | None) -> None:
        """`reason` and `step_end` before `next_due`, with no agreement read: no base agreed, nothing to commit, the
        trajectory line and the progress."""
        self.base.agreed(NOTHING_AGREED)  # as `reason` does: it is False here already, and stays so by construction
        self._line(loss, lr)

    def _line(self, loss: Loss | None, lr: Rate | None) -> None:
        step, epoch = self.position.step, self.position.epoch
        self.telemetry.record(step, epoch, loss, lr, None)
        self.telemetry.progress(step, epoch, loss)

    def step_end(
        self, reason: str | None, loss: Loss | None, lr: Rate | None, received_at: float | None, alongside: AbstractContextManager
    ) -> None:
        """After the agreement: log the trajectory, report progress and a stop, and write the checkpoint due. `alongside`:
        the caller's work that goes with a checkpoint (the census), entered around its write whenever one is due."""
        step, epoch = self.position.step, self.position.epoch
        hash_due = bool(self.policy.hash_every_steps) and step % self.policy.hash_every_steps == 0
        if reason is None and not hash_due:  # most steps: a trajectory line and the progress, nothing of the state
            self._line(loss, lr)
            return
        began = time.monotonic()
        if reason == "periodic":
            self._committed(self.periodic.make_room(step), "periodic", background=True)
        # One pass over the state serves both the trajectory hash and the checkpoint.
        parts = table.capture(self.components) if reason or hash_due else {}
        seen = Digests()
        staged = self._stage(parts) if reason == "periodic" and step >= self.standing else None
        components = table.digests(parts, seen) if staged is None or hash_due else {}
        self.telemetry.record(step, epoch, loss, lr, components if hash_due else None)
        self.telemetry.progress(step, epoch, loss)
        if reason == "signal":
            self.telemetry.stop_agreed(step, received_at)
            self.telemetry.say("rank %d: ranks agreed to stop after step %d; run the same command again to resume", self.peers.rank, step)
        if reason is None:
            return
        # After the capture and the digests, which need the CPU: what runs alongside gets the time spent on the disk.
        with alongside:
            if step < self.standing:
                self._hold(reason)
            elif staged is not None:
                self._save_async(staged)
            else:
                self._committed(self.periodic.finish(), "periodic", background=True)
                self._save(reason, parts, components, seen)
        if reason == "periodic":
            self.schedule.blocked(time.monotonic() - began)

    def _hold(self, reason: str) -> None:
        """No checkpoint before the standing one (see `standing`); a stop leaves it to the next attempt."""
        step = self.position.step
        if reason != "signal":
            log.info(
                "rank %d: no %s checkpoint at step %d: the checkpoint at step %d stands until this run passes it",
                self.peers.rank,
                reason,
                step,
                self.standing,
            )
            return
        self.telemetry.emit(Kind.REPLAY_STOPPED, step=step, checkpoint_step=self.standing)
        self.telemetry.say(
            "rank %d: stopped at step %d without a checkpoint: the checkpoint at step %d still stands, and the next "
            "attempt resumes it again",
            self.peers.rank,
            step,
            self.standing,
        )

    def close(self) -> None:
        """Leave: the periodic writer stops (a checkpoint in flight stays unpublished)."""
        self.periodic.close()

    def _meta(self, reason: str) -> dict[str, Any]:
        return {"reason": reason, "epoch": self.position.epoch, **self.meta, "threads": torch.get_num_threads()}

    def _save(self, reason: str, parts: dict[str, Any], components: dict[str, str], seen: Digests) -> None:
        self.telemetry.sync()
        rank, step = self.peers.rank, self.position.step
        by_replay = self._held_by_replay(reason)
        base_files, at, has_base = self.base.for_checkpoint(step, reason, by_replay)
        files = {} if by_replay else layout.files(self.components, parts, rank, world_size=self.peers.world_size)
        files.update(base_files)
        base = self.base.share(at) if has_base else None
        snapshot = self.base.snapshot
        seen_all = (seen, snapshot.seen) if base_files and snapshot is not None else (seen,)
        share = ckpt.RankShare(rank, files, components, rank_hash(components), replay=base, seen=seen_all)
        meta = {**self._meta(reason), bases.BY_REPLAY: True} if by_replay else self._meta(reason)
        try:
            committed = ckpt.write_checkpoint(
                self.root, step, share, self.peers.world_size, self.peers.group, meta, self.policy.keep_last, self.kill
            )
        except NotWritten as exc:
            self.schedule.saved()  # the next try after a full interval, not at every step
            self._not_written(reason, exc)
            return
        if by_replay:
            committed = dataclasses.replace(committed, replays_from=self.base.step)
        self.schedule.saved()
        log.info(
            "rank %d: %s checkpoint step %d committed in %.3fs, global hash %s",
            rank,
            reason,
            step,
            committed.seconds,
            committed.global_hash,
        )
        self._committed(committed, reason)

    def newest_published(self) -> int | None:
        """The step of the newest checkpoint published in the run directory (where the next launch resumes), None before
        the first, or when the directory cannot be read (never an error of its own: it is asked while one is raised)."""
        try:
            return next((checkpoint_step(p) for p in list_checkpoints(self.root)), None)
        except OSError:
            return None

    def _not_written(self, reason: str, exc: NotWritten) -> None:
        """A checkpoint the ranks could not write: say it with what stands, record it, and go on (periodic), stop without it
        (a stop: the next attempt resumes the one that stands) or end the run unsaved (final: `unsaved_end`)."""
        standing = self.newest_published()
        since = "the start" if standing is None else f"step {standing}"
        then = {
            "periodic": f"Training goes on, and the next checkpoint tries again: {exc.fix} before the run stops, or the steps "
            f"since {since} are trained again after it",
            "signal": f"The ranks stop without it: the next attempt resumes from {since} and trains the steps since again. "
            f"{exc.fix.capitalize()} before it starts",
            "final": f"Training reached its last step, but the run is not done without this checkpoint: {exc.fix} and run the "
            f"same command again; it resumes from {since} and trains the rest again",
        }[reason]
        stands = "no checkpoint stands yet" if standing is None else f"the checkpoint at step {standing} stands"
        message = f"{reason} {exc}; {stands}. {then}."
        self.unsaved_end = self.unsaved_end or reason == "final"
        self.telemetry.say("rank %d: %s", self.peers.rank, message)
        self.telemetry.emit(
            Kind.CHECKPOINT_FAILED,
            step=exc.step,
            reason=reason,
            errors={str(r): e for r, e in exc.errors.items()},
            standing=standing,
            message=message,
        )

    def _held_by_replay(self, reason: str) -> bool:
        """Whether the checkpoint due now writes its base only: a stop under verify "error" that has a base, whose resume
        replays to step N and proves it by the digests (under "warn" a divergent replay falls back to N's own files)."""
        return reason == "signal" and self.policy.verify != "warn" and self.base.holds_the_state_of(self.position.step)

    def _stage(self, parts: dict[str, Any]) -> Snapshot | None:
        """The periodic writer's blocking part: its copy of this rank's share (None: it writes from the live state)."""

        def files() -> tuple[dict[str, Any], set[str]]:
            self.telemetry.flush()  # the copy reads what the device computed; the durable sync is _save_async's
            return self._layout(parts)

        return self.periodic.stage(self.position.step, parts, files)

    def _layout(self, parts: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
        """This rank's files of the live state `parts` (built here, where the live module is: per-rank buffer names), and
        which of them hold replicated state."""
        files = layout.files(self.components, parts, self.peers.rank, world_size=self.peers.world_size)
        return files, layout.for_everyone(files, self.peers.rank)

    def _save_async(self, staged: Snapshot) -> None:
        """Hand the staged state to the periodic writer; it is committed at a later agreed boundary."""
        # Every line up to this step's own must reach the disk before the checkpoint can, since a resume from it keeps
        # the lines up to its step (a kill after the background commit lost one).
        self.telemetry.sync()
        files = dict(staged.files)
        base_files, at, has_base = self.base.for_checkpoint(self.position.step, "periodic")
        files.update(base_files)
        base = self.base.deferred_share(at) if has_base else lambda: None
        holds = (staged, self.base.snapshot) if has_base and self.base.snapshot is not None else (staged,)
        self.periodic.start(Job(self.position.step, staged, files, base, self._meta("periodic"), holds, staged.copy_s))
        self.schedule.saved()

    def _committed(self, committed: Outcome, reason: str, background: bool = False) -> None:
        """Report a published checkpoint (rank 0 alone knows an asynchronous one's global hash), or one abandoned;
        `background`: written while the loop trained on."""
        if isinstance(committed, NotWritten):
            self._not_written(reason, committed)
            return
        if committed is None:
            return
        self.base.committed(committed.step)
        if not committed.global_hash:
            return
        self.last_checkpoint = committed
        self.telemetry.committed(committed, reason, background)
