"""The hang watchdog: an attempt whose ranks all stopped making progress is ended with every stack, and resumes.

Each rank runs one long-lived thread (started with the Session, before any
DataLoader forks, and never restarted: a thread starting or ending while a
loader forks its workers is how a worker deadlocks in `fork()`). The training
thread only leaves marks: the phase it is in and, after each step, the time
(`beat`, `stepped`). Every few seconds the thread looks for activity: a new
mark, a change of the main thread's Python stack, or the main thread keeping a
CPU busy. A rank busy outside its steps shares that with the other ranks
through the mtime of one file per attempt in the run directory (while every
rank steps, nothing is written), so a validation on rank 0 while the others
wait in a barrier is activity for all of them, and a wait in a collective, on
a lock, or on a stopped DataLoader worker is not.

When no rank has shown activity for longer than the bound (`HangPolicy`: a
floor, a multiple of the slowest step, a longer bound for start-up, restore,
replay, checkpoints and an epoch's end), the rank writes every thread's stack
of itself, its DataLoader workers, and the other ranks of its host into
`hangs/<job>/<attempt>/` (legato.system.stacks), the first rank there records
a `hang` event, and the rank exits 124 (EXIT_HUNG): its launcher or
supervisor runs it again, and it resumes from its newest verified checkpoint.
A hang at the step and frame an earlier attempt hung at is not retried: the
rank exits 1 and the record says `repeated`.

A main thread that spins in C (a GPU collective whose host thread
spin-waits) keeps a CPU busy and reads as active: NCCL's own watchdog ends
those. This module must never touch the training thread beyond its marks, and
never wait on anything the training thread may hold.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from legato.errors import EXIT_FAILED, EXIT_HUNG
from legato.events import Kind, stuck_in_own_code
from legato.paths import RunPaths
from legato.session.policy import HangPolicy
from legato.system import stacks
from legato.system.processes import children, kill, stat_fields

log = logging.getLogger(__name__)

# The phases a rank's marks name; every phase but STEP is bounded by `phase_s`.
START_UP, RESTORE, REPLAY, STEP, CHECKPOINT, EPOCH_END = "start-up", "restore", "replay", "step", "checkpoint", "epoch end"
STEP_WINDOW = 64  # the step times the bound looks back over
# A main thread that used this share of one CPU since the last look is computing, not stuck: a wait in a collective or
# on a lock uses none, and a computing thread gets far more even on a machine shared by a few busy processes.
BUSY_SHARE = 0.1
RECORD_FILE = "hang.json"  # created once per attempt, by the rank that records the hang
FOUND_SUFFIX = ".found"  # rank<R>.found: rank R found the hang (an empty file, written before its stacks)
ENDING_WAIT_S = 120.0  # how long the loop's end waits for a hang being recorded to end the process
RECORD_GRACE_S = 1.0  # how long the recording rank waits for the others' summaries
# A rank of another host that has not said it found the hang this many looks (plus the grace) after this rank found it
# is silent: healthy ranks find it within a look or two of each other (each looks on its own schedule).
ANSWER_LOOKS = 2
# How long each rank that found the hang waits, before it records it, for the summaries of the others that found it:
# a rank collects the stacks of every process of its host it reaches first (its workers and its neighbours', at most
# stacks.ANSWER_WAIT_S apiece, and only a stopped one takes that long); four of those is room for a stopped rank and
# a few stopped workers.
SUMMARY_WAIT_S = 4 * stacks.ANSWER_WAIT_S
ANSWER_POLL_S = 0.2  # how often the recording rank looks again for a rank of another host
STACK_FRAMES = 12  # of the main thread's innermost frames, compared between looks
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Peer:
    """One rank as the watchdog needs it: where it runs and its pid."""

    rank: int
    host: str
    pid: int


class Watchdog:
    """One rank's watchdog (see the module docstring): `beat` and `stepped` from the training thread, `stop` at the end."""

    def __init__(
        self, policy: HangPolicy, rank: int, peers: list[Peer], run_dir: Path, job_id: str, attempt: int, emit: Callable[[dict], None]
    ):
        self.policy, self.rank, self.peers = policy, rank, peers
        self.run_dir = run_dir
        self.folder = RunPaths(run_dir).hangs(job_id, attempt)
        self.activity = RunPaths(run_dir).activity(job_id, attempt)
        self.emit = emit
        self.host = socket.gethostname()
        self._mark = (START_UP, time.monotonic())
        self._step = 0
        self._steps = [0.0] * STEP_WINDOW  # a ring: read whole by the thread while the training thread writes one slot
        self._count = 0
        # The training thread: the one that creates the Session (the main thread in every launcher we know; a forked
        # process's thread object may still carry its parent's native id, so it is read here, not from `threading`).
        self._ident, self._native_id = threading.get_ident(), threading.get_native_id()
        self._stopping = threading.Event()
        self._ending = threading.Event()  # set once the thread decided the attempt is hung: it ends the process
        self._thread = threading.Thread(target=self._watch, name="legato-watchdog", daemon=True)

    @classmethod
    def start(
        cls,
        policy: HangPolicy,
        gather: Callable[[object], list],
        rank: int,
        run_dir: Path,
        job_id: str,
        attempt: int,
        emit: Callable[[dict], None],
    ) -> Watchdog:
        """Collective (through `gather`): learn every rank's host and pid, and start watching; with the policy off, a
        watchdog that only takes the marks."""
        if not policy.watchdog:
            return cls(policy, rank, [], run_dir, job_id, attempt, emit)
        peers = [Peer(r, host, pid) for r, (host, pid) in enumerate(gather((socket.gethostname(), os.getpid())))]
        stacks.arm()
        watchdog = cls(policy, rank, peers, run_dir, job_id, attempt, emit)
        watchdog._thread.start()
        return watchdog

    # -- the training thread's marks ----------------------------------------

    def beat(self, phase: str) -> None:
        """The rank entered `phase` now."""
        self._mark = (phase, time.monotonic())

    def stepped(self, step: int, phase: str = STEP) -> None:
        """A step ended; `phase` is what comes next. Only a step that followed a step counts toward the bound."""
        now = time.monotonic()
        if self._mark[0] == STEP:
            self._steps[self._count % STEP_WINDOW] = now - self._mark[1]
            self._count += 1
        self._step = step
        self._mark = (phase, now)

    def stop(self) -> None:
        """The loop ended: nothing more to watch (the thread ends within one look). A hang already found ends the
        process first: the loop may have ended only because a peer was continued to answer for its stacks."""
        self._stopping.set()
        if self._ending.is_set():
            self._thread.join(ENDING_WAIT_S)

    # -- the thread -----------------------------------------------------

    def bound_s(self, phase: str) -> float:
        """How many quiet seconds count as a hang in `phase`."""
        if phase != STEP:
            return self.policy.phase_s
        return max(self.policy.floor_s, self.policy.step_factor * max(self._steps))

    @property
    def look_s(self) -> float:
        """How often the thread looks for activity."""
        return min(10.0, max(0.5, self.policy.floor_s / 10))

    def _watch(self) -> None:
        every = self.look_s
        seen = (self._mark, self._signature(), self._cpu_s())
        local_active = time.time()
        while not self._stopping.wait(every):
            now = (self._mark, self._signature(), self._cpu_s())
            marked = now[0] is not seen[0]
            busy = now[1] != seen[1] or now[2] - seen[2] >= BUSY_SHARE * every
            if marked or busy:
                local_active = time.time()
            if busy and not marked:
                # Busy outside the steps (a validation on this rank alone): the ranks waiting for it must know. While
                # every rank steps, each sees its own marks, and nothing is written.
                self._touch()
            seen = now
            quiet = time.time() - max(local_active, self._shared_activity())
            phase = now[0][0]
            bound = self.bound_s(phase)
            if quiet > bound and not self._stopping.is_set():
                self._end(phase, quiet, bound)

    def _signature(self) -> tuple:
        """The training thread's innermost frames (code, line and bytecode offset): unchanged between looks while it waits
        in C. A tight Python loop can look the same at every look too (the GIL changes hands at the same instructions):
        its CPU time says it runs."""
        frame = sys._current_frames().get(self._ident)
        found: list[tuple[int, int, int]] = []
        try:
            while frame is not None and len(found) < STACK_FRAMES:
                found.append((id(frame.f_code), frame.f_lineno, frame.f_lasti))
                frame = frame.f_back
        except AttributeError:
            # Seen once (CPython 3.11, an in-process run under torch.compile): a frame's f_back read from this thread
            # gave another object. A stack that cannot be read counts as one that moved; the thread must not die.
            return (time.monotonic(),)
        return tuple(found)

    def _cpu_s(self) -> float:
        """CPU seconds the training thread has used (0 where /proc does not say)."""
        fields = stat_fields(self._native_id)
        if fields is None:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def _touch(self) -> None:
        path = self.activity
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()  # sets the mtime to now, the file existing or not
        except OSError as exc:  # a full disk: this rank's own activity still counts for itself
            log.debug("activity mark not written: %s", exc)

    def _shared_activity(self) -> float:
        try:
            return self.activity.stat().st_mtime
        except OSError:
            return 0.0

    # -- the end of a hung attempt -----------------------------------------

    def _end(self, phase: str, quiet: float, bound: float) -> None:
        """Write the stacks this rank can reach, record the hang (first rank only), and end this process."""
        self._ending.set()
        found_at = time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        # Said before the stacks, which can take a while: the recording rank counts the ranks that found the hang.
        with contextlib.suppress(OSError):
            (self.folder / f"rank{self.rank}{FOUND_SUFFIX}").touch()
        # Where the rank stands now: once a stopped peer is continued to answer, the training may move on for a moment.
        step, (frame, user_frame) = self._step, _frames(sys._current_frames().get(self._ident))
        stopped = self._write_stacks(step)
        repeated = self._repeated(step, frame)
        mine = {"rank": self.rank, "host": self.host, "step": step, "frame": frame, "user_frame": user_frame, "stopped": stopped}
        _first(self.folder / f"rank{self.rank}.json", mine)
        time.sleep(RECORD_GRACE_S)  # the other ranks' summaries arrive
        answered = self._await_answers(found_at + RECORD_GRACE_S + ANSWER_LOOKS * self.look_s)
        summaries = self._await_summaries(answered, time.monotonic() + SUMMARY_WAIT_S)
        named = _culprit(mine, summaries)
        all_stopped = sorted({name for summary in summaries for name in summary.get("stopped", [])} | set(stopped))
        record = {
            **named,
            "phase": phase,
            "quiet_s": round(quiet, 1),
            "bound_s": round(bound, 1),
            "stopped": all_stopped,
            "silent": _silent(self.peers, self.host, answered, all_stopped),
            "stacks": str(self.folder.relative_to(self.run_dir)),
            "repeated": repeated,
        }
        if _first(self.folder / RECORD_FILE, record):
            self.emit({"event": Kind.HANG, **record})
        code = EXIT_FAILED if repeated else EXIT_HUNG
        log.error(
            "rank %d: no rank made progress for %.0fs (bound %.0fs; phase %s at step %d; main thread in %s)%s; stacks in %s; exiting %d",
            self.rank,
            quiet,
            bound,
            phase,
            step,
            user_frame or frame,
            f"; stopped: {', '.join(stopped)}" if stopped else "",
            self.folder,
            code,
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        self._end_processes(stopped)
        os._exit(code)

    def _await_answers(self, deadline: float) -> set[int]:
        """The ranks that said they found the hang, once every rank of another host did or `deadline` (monotonic) passed."""
        remote = {peer.rank for peer in self.peers if peer.host != self.host}
        answered = self._answered()
        while remote - answered and time.monotonic() < deadline:
            time.sleep(ANSWER_POLL_S)
            answered = self._answered()
        return answered

    def _await_summaries(self, answered: set[int], deadline: float) -> list[dict]:
        """The summaries of the ranks that said they found the hang, once each wrote its own or `deadline` (monotonic)
        passed. A rank writes its summary after the stacks it collects, and a stopped process it collects is continued
        while it answers: another rank looking then finds it running, so only the collector's summary names it stopped."""
        summaries = self._summaries()
        while answered - {s["rank"] for s in summaries} and time.monotonic() < deadline:
            time.sleep(ANSWER_POLL_S)
            summaries = self._summaries()
        return summaries

    def _answered(self) -> set[int]:
        names = (path.name.removeprefix("rank").removesuffix(FOUND_SUFFIX) for path in self.folder.glob(f"rank*{FOUND_SUFFIX}"))
        return {int(name) for name in names if name.isdigit()}

    def _summaries(self) -> list[dict]:
        """The summaries the ranks of this attempt wrote so far (rank, host, step, frames, stopped)."""
        found = []
        for path in sorted(self.folder.glob("rank*.json")):
            with contextlib.suppress(OSError, ValueError):
                summary = json.loads(path.read_text())
                if isinstance(summary, dict) and "rank" in summary:
                    found.append(summary)
        return found

    def _write_stacks(self, step: int) -> list[str]:
        """Every reachable process's stacks, one file each; returns the ones found stopped (by a signal) before asking."""
        stopped = []
        own = self.folder / f"rank{self.rank}.txt"
        with contextlib.suppress(OSError), open(own, "x") as f:
            f.write(f"rank {self.rank} pid {os.getpid()} on {self.host}, step {step}\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        targets = [(self.rank, None, os.getpid()), *((peer.rank, peer.pid, peer.pid) for peer in self.peers if self._neighbour(peer))]
        for rank, rank_pid, parent in targets:
            processes = [(f"rank{rank}", f"rank {rank}", rank_pid)] if rank_pid else []
            processes += [(f"rank{rank}-worker{pid}", f"rank {rank} worker {pid}", pid) for pid in children(parent)]
            for file_name, label, pid in processes:
                if stacks.stopped(pid):
                    stopped.append(label)
                _write_other(self.folder / f"{file_name}.txt", file_name, pid)
        return stopped

    def _repeated(self, step: int, frame: str) -> bool:
        """Whether this rank hung at this step, in this frame, in an earlier attempt of the run (its summary says so)."""
        for summary in RunPaths(self.run_dir).hang_root.glob(f"*/*/rank{self.rank}.json"):
            if summary.parent == self.folder:
                continue
            try:
                earlier = json.loads(summary.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(earlier, dict) and earlier.get("step") == step and earlier.get("frame") == frame:
                return True
        return False

    def _end_processes(self, stopped: list[str]) -> None:
        """This rank's workers go with it; so do its host's ranks that were stopped (a stopped process outlives the
        launcher's SIGTERM, and srun does not end the others when one task exits)."""
        for pid in children(os.getpid()):
            kill(pid, signal.SIGKILL)
        for peer in self.peers:
            if self._neighbour(peer) and f"rank {peer.rank}" in stopped:
                kill(peer.pid, signal.SIGKILL)

    def _neighbour(self, peer: Peer) -> bool:
        """Another rank of this host: one whose processes this rank can reach."""
        return peer.host == self.host and peer.rank != self.rank


def _culprit(mine: dict, summaries: list[dict]) -> dict:
    """The rank the record names: one whose main thread is stuck in the user's own code (a deadlock, an endless wait of
    its own) rather than waiting in a library for the others, else this rank."""
    for summary in [mine, *summaries]:
        if stuck_in_own_code(summary):
            return {k: summary.get(k) for k in ("rank", "host", "step", "frame", "user_frame")}
    return {k: mine[k] for k in ("rank", "host", "step", "frame", "user_frame")}


def _silent(peers: list[Peer], host: str, answered: set[int], stopped: list[str]) -> dict[str, str]:
    """The ranks of other hosts than `host` that never said they found the hang (rank -> their host): stopped, frozen or
    cut off where no rank could look. A rank another rank of its host found stopped is in `stopped` instead."""
    return {
        str(peer.rank): peer.host
        for peer in peers
        if peer.host != host and peer.rank not in answered and f"rank {peer.rank}" not in stopped
    }


def _write_other(path: Path, name: str, pid: int) -> None:
    """Another process's stacks into `path`, unless another rank wrote them first."""
    with contextlib.suppress(OSError), open(path, "x") as f:
        answer = stacks.collect(pid)
        f.write(f"{name} pid {pid}\n")
        f.write(answer if answer is not None else "(no answer: the process is gone, or not a legato process)\n")


def _frames(frame: FrameType | None) -> tuple[str, str | None]:
    """The innermost frame, and the innermost one of the user's own code (outside torch, legato and the standard library)."""
    innermost, user = None, None
    while frame is not None:
        code = frame.f_code
        where = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        innermost = innermost or where
        if user is None and not _library(code.co_filename):
            user = where
        frame = frame.f_back
    return innermost or "unknown", user


def _library(filename: str) -> bool:
    parts = Path(filename).parts
    return (
        "torch" in parts
        or "legato" in parts
        or filename.startswith(sys.prefix)
        or filename.startswith(sys.base_prefix)
        or filename.startswith("<")
    )


def _first(path: Path, record: dict) -> bool:
    """Create `path` holding `record`; False when another rank created it first."""
    try:
        with open(path, "x") as f:
            json.dump(record, f)
    except FileExistsError:
        return False
    except OSError as exc:
        log.warning("hang record %s not written: %s", path, exc)
    return True
