"""Asynchronous periodic checkpoints: training waits only for a memory copy, never for the disk.

At the agreed step every rank copies its share of the state (the files it
writes) into a staging buffer that is allocated once and reused
(`legato.state.snapshot.Snapshot`, the same mechanism as the replay base; the
copy is the only blocking part) and hands it to one background thread (at
the lowest CPU priority, so that on a busy machine the steps keep their cores
and the write fills idle time), which hashes the staged copy (the one hash
pass), writes and fsyncs its files into `<root>/.tmp_step_<N>/` and last
writes its report (`.report_rank<R>.json`, fsynced) with its share of the
digests; the leader completes every rank's digests from the reports. Whether every rank's
files are durable is agreed through the stop agreement's non-blocking
all-reduce (legato.dist.stop), so no step waits for it; once all are, rank 0 builds
the manifest from the reports and publishes the directory with the same atomic
rename as a synchronous checkpoint (the phases of legato.store.commit), and
one small broadcast tells every rank whether it could (the manifest's write
can find the disk full too). Until then the
checkpoint lives only in a temporary directory: it is never selectable, never
counted in `keep_last`, and pruning happens only after a publish.

Every decision here (start, skip, commit, abandon) is taken at agreed steps
from agreed values, so all ranks take it together. At most one checkpoint is
in flight; one due meanwhile first waits for it (logged), so the steps that
get a checkpoint never depend on timing. A stop or final checkpoint
first `finish`es the one in flight (waits for it, one small blocking
all-reduce, commits it). Nothing the worker reads is written to while it runs:
`release` waits for the worker before a buffer it holds is reused.
This module must never draw from an RNG, and its worker thread must never
touch the process group.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from legato.dist.stop import Decision
from legato.files import fsync_dir, write_fsynced
from legato.state.snapshot import Snapshot
from legato.store import commit
from legato.store.commit import Committed, KillPoint, NotWritten

log = logging.getLogger(__name__)

REPORT_PREFIX = ".report_rank"
# The worker thread's nice value. Its work is never urgent (at most one write is in flight and a stop waits
# for it), while the training thread's is: on an oversubscribed machine (two ranks on two cores, a busy
# node) the kernel then gives a contended core to the step and the write fills the idle time. Measured
# (docs/benchmarks.md): steps 1.7x slower during a write at nice 0 with a core busy elsewhere, 0.96x at 19.
WRITER_NICE = 19


@dataclass
class Job:
    """What the worker writes for one checkpoint: the staged state and how to lay it out."""

    step: int
    staged: Snapshot
    files: dict[str, Any]  # file name -> state: references into buffers nobody writes meanwhile
    replay: Callable[[], dict | None]  # the replay base share (digests of the base and the step records)
    meta: dict[str, Any]
    holds: tuple[Snapshot, ...]  # every buffer the worker reads
    blocking_s: float = 0.0


@dataclass
class _InFlight:
    job: Job
    tmp: Path
    future: Future
    started: float


class AsyncCheckpointer:
    """One rank's side of the asynchronous checkpoints of a Session."""

    def __init__(
        self, root: Path, rank: int, world_size: int, group: dist.ProcessGroup | None, keep_last: int, kill: KillPoint | None
    ) -> None:
        self.root, self.rank, self.world_size, self.group = root, rank, world_size, group
        self.keep_last, self.kill = keep_last, kill
        self.staging = Snapshot()
        self.in_flight: _InFlight | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="legato-checkpoint", initializer=_lower_priority)
        # Its thread starts now, with the Session, not at the first checkpoint beside a loader's fork (legato.system.io_threads).
        self._executor.submit(int).result()

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is in flight (agreed: the same on every rank at every step)."""
        return self.in_flight is not None

    def votes(self) -> dict[str, bool]:
        """This rank's part of the next agreement: still writing, or failed."""
        if self.in_flight is None:
            return {"writing_local": False, "failed_local": False}
        future = self.in_flight.future
        return {"writing_local": not future.done(), "failed_local": future.done() and future.exception() is not None}

    def stage(self, step: int, parts: dict[str, Any], files: Callable[[], tuple[dict[str, Any], set[str]]]) -> Snapshot:
        """The blocking part: copy this rank's files of the live state (`files()`: what each file holds, and which hold
        replicated state) into the reused staging buffer (`Snapshot.take`)."""
        assert self.in_flight is None, "stage() while a checkpoint is in flight"
        self.staging.take(step, parts, *files())
        return self.staging

    def start(self, job: Job) -> None:
        """Hand a staged checkpoint to the worker thread (phase stage here, phase write there)."""
        tmp = commit.stage(self.root, job.step, self.rank, fresh=False)
        future = self._executor.submit(self._write, job, tmp)
        self.in_flight = _InFlight(job, tmp, future, time.perf_counter() - job.blocking_s)

    def lend_staged(self, step: int, swap: Callable[[Snapshot], Snapshot]) -> bool:
        """Whether the copy staged at `step` (read by the write in flight) went to `swap`, which gives back the buffer
        to stage the next checkpoint into: the replay base taken at the step just staged shares the copy."""
        if self.in_flight is None or self.staging.step != step:
            return False
        self.staging = swap(self.staging)
        return True

    def release(self, buffer: Snapshot) -> None:
        """Before `buffer` is written to: wait until the worker no longer reads it."""
        if self.in_flight is not None and any(buffer is held for held in self.in_flight.job.holds):
            self._wait_local()

    def settle(self, decision: Decision) -> Committed | NotWritten | None:
        """Collective when it commits, at an agreed boundary: commit the checkpoint in flight once every rank's files are
        durable (NotWritten: abandoned, a rank failed to write or rank 0 to publish; None: nothing to commit yet)."""
        if self.in_flight is None or decision.checked_at is None or decision.checked_at <= self.in_flight.job.step:
            return None  # that agreement was started before this checkpoint
        if decision.writing:
            return None  # even after a failure: the leader removes the directory only once no rank writes into it
        if decision.failed:
            return self._abandon("a rank failed to write its files")
        return self._commit()

    def finish(self) -> Committed | NotWritten | None:
        """Collective, at an agreed step: wait for the checkpoint in flight and commit it (or abandon it: NotWritten)."""
        if self.in_flight is None:
            return None
        failed = not self._wait_local()
        if self.group is not None:
            flag = torch.tensor([int(failed)], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            failed = bool(flag[0])
        if failed:
            return self._abandon("a rank failed to write its files")
        return self._commit()

    def make_room(self, step: int) -> Committed | NotWritten | None:
        """Collective when one is in flight: a checkpoint is due at `step`; wait for that one (the disk sets the pace)."""
        if self.in_flight is None:
            return None
        if not self.in_flight.future.done():  # written already, it waited only for an agreed check to commit it
            log.warning(
                "rank %d: periodic checkpoint at step %d waits for the one of step %d, still being written (at most one in flight)",
                self.rank,
                step,
                self.in_flight.job.step,
            )
        return self.finish()

    def close(self) -> None:
        """Leave: wait for the worker (its directory stays temporary, never published) and stop the thread."""
        if self.in_flight is not None:
            log.warning("rank %d: leaving with the checkpoint of step %d unpublished", self.rank, self.in_flight.job.step)
            self._wait_local()
            self.in_flight = None
        self._executor.shutdown(wait=True)
        self.group = None  # the Session ends the group once every holder let it go

    # -- internals ----------------------------------------------------------

    def _wait_local(self) -> bool:
        """Wait for this rank's worker; False (and the error logged) when its write failed."""
        assert self.in_flight is not None
        error = self.in_flight.future.exception()
        if error is not None:
            log.error("rank %d: writing checkpoint step %d failed: %s", self.rank, self.in_flight.job.step, error)
        return error is None

    def _write(self, job: Job, tmp: Path) -> None:
        """The worker: one hash pass over the staged copy, then write, fsync, report."""
        share = job.staged.share()
        replay = job.replay()
        written = commit.write_files(tmp, job.files, tuple(h.seen for h in job.holds))
        commit.kill_point(self.kill, job.step, "after_shards")
        report = commit.report(self.rank, "", {}, written, replay, share)
        write_fsynced(tmp / f"{REPORT_PREFIX}{self.rank}.json", json.dumps(report, sort_keys=True).encode())
        fsync_dir(tmp)

    def _commit(self) -> Committed | NotWritten:
        """Collective: rank 0 publishes from the reports, and every rank learns whether it could (NotWritten: it could not)."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        step, tmp = flight.job.step, flight.tmp
        reports = [json.loads((tmp / f"{REPORT_PREFIX}{r}.json").read_text()) for r in range(self.world_size)] if self.rank == 0 else []
        reports = commit.complete(reports)
        ghash = commit.combined_hash(reports)
        error = None
        if self.rank == commit.LEADER:
            commit.warn_diverged(reports)
            error = commit.publish_or_remove(self.root, tmp, step, self.world_size, reports, ghash, flight.job.meta, self.kill)
            if error is None:
                commit.prune(self.root, self.keep_last, keep=step)
        # Every rank must hear of a publish that failed: a rank that counted this step as on disk would later refer
        # to it as a replay base that was never published.
        try:
            commit.leader_outcome(self.root, step, error, self.group)
        except NotWritten as exc:
            log.error(
                "rank %d: checkpoint step %d abandoned (its manifest could not be published); the previous checkpoint stands",
                self.rank,
                step,
            )
            return exc
        seconds = time.perf_counter() - flight.started
        log.info(
            "rank %d: asynchronous checkpoint step %d committed %.3fs after its step (%.3fs blocking)",
            self.rank,
            step,
            seconds,
            flight.job.blocking_s,
        )
        return commit.committed(self.root, step, reports, ghash, seconds)

    def _abandon(self, why: str) -> NotWritten:
        """Collective, once every rank's worker is done: drop the checkpoint in flight. The ranks exchange what their
        workers met, so each names every rank's write error; an error the disk did not cause is a bug, raised on every
        rank (its own on the rank that met it) as the synchronous driver raises it, never reported as a full disk."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        step = flight.job.step
        log.error("rank %d: checkpoint step %d abandoned (%s); the previous checkpoint stands", self.rank, step, why)
        error = flight.future.exception()
        mine = _outcome(self.rank, error)
        outcomes = commit.agree(mine, self.world_size, self.group)
        if self.rank == commit.LEADER:
            shutil.rmtree(flight.tmp, ignore_errors=True)
        if error is not None and mine["bug"]:
            raise error
        bugs = "; ".join(f"rank {o['rank']}: {o['text']}" for o in outcomes if o["bug"])
        if bugs:
            raise RuntimeError(f"checkpoint step {step}: a background writer failed with an error of its own ({bugs}); its log has it")
        return NotWritten(step, {o["rank"]: o["text"] for o in outcomes if o["text"] is not None}, self.root)


def _outcome(rank: int, error: BaseException | None) -> dict:
    """What a rank's worker met, for the others: nothing (text None), the OSError the disk gave it, or a bug."""
    if error is None:
        return {"rank": rank, "bug": False, "text": None}
    written = commit.write_error(error)
    return {"rank": rank, "bug": written is None, "text": repr(error) if written is None else str(written)}


def _lower_priority() -> None:
    """In the worker thread: yield contended CPU to the training thread (Linux nice is per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (OSError, AttributeError) as exc:  # not Linux, or a sandbox that forbids it: the write just competes
        log.debug("checkpoint writer keeps its priority: %s", exc)
