"""One launch per run directory: the lock rank 0 holds while its launch trains there.

Two launches into one run directory (a job submitted twice, a relaunch beside a
launch that still runs) would train side by side and interleave their
checkpoints, ledger records and trajectories without a word. Rank 0 of every
launch takes an exclusive lock on `RunPaths.attempt_lock` before the launch
records anything, and writes who holds it into the file. A second launch
waits a few seconds (an attempt that is ending lets go as its process exits),
then every one of its ranks is refused with exit 2, naming the holder.

The lock is a POSIX record lock (fcntl), not flock: it belongs to the process,
so the DataLoader workers rank 0 forks do not inherit it, and NFS carries it
between nodes. The kernel drops it when the process ends however it ends, so a
hard kill leaves no stale lock. Where the filesystem refuses locks (Lustre
mounted without `flock`), the launch goes on with a warning. `legato run`
asks `held_by` before it starts a run there, so it refuses before it records
anything. A holder must never open the lock file a second time: closing any
descriptor of a file drops the process's locks on it. This module must never
write anything but the holder's line, and never decide anything about training.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from legato.errors import UsageError
from legato.paths import RunPaths

if TYPE_CHECKING:  # the supervisor probes the lock without torch (`held_by`)
    from legato.dist.peers import Peers

log = logging.getLogger(__name__)

WAIT_S = 10.0  # how long a launch waits for the one before it to finish exiting
_POLL_S = 0.2
_HELD = (errno.EACCES, errno.EAGAIN)


class AttemptLock:
    """Rank 0's hold on its run directory for this launch (other ranks, and filesystems without locks, hold nothing)."""

    def __init__(self, fd: int | None) -> None:
        # A Session that failed after the claim, or was dropped unused, lets go when it is collected.
        self._release = weakref.finalize(self, os.close, fd) if fd is not None else None

    @classmethod
    def claim(cls, run_dir: Path, peers: Peers, wait_s: float = WAIT_S) -> AttemptLock:
        """Collective: rank 0 takes the run directory's lock; where another launch holds it, every rank is refused."""
        fd, refused = None, None
        if peers.rank == 0:
            fd, refused = _take(RunPaths(run_dir), wait_s)
        refused = peers.from_leader(refused)
        if refused is not None:
            raise UsageError(refused)
        return cls(fd)

    def release(self) -> None:
        """Let the run directory go (closing the file drops the lock); a second call does nothing."""
        if self._release is not None:
            self._release()


def _take(paths: RunPaths, wait_s: float) -> tuple[int | None, str | None]:
    """The locked file's descriptor, or the refusal that names the launch holding it."""
    paths.root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(paths.attempt_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return None, (
            f"{paths.attempt_lock} is a symbolic link, and legato writes nothing outside the run directory it is "
            "given. Remove the link (the launch recreates the file) and launch again."
        )
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in _HELD:
                os.close(fd)
                log.warning(
                    "cannot lock %s (%s): a second launch into this run directory would not be refused", paths.attempt_lock, exc.strerror
                )
                return None, None
        else:
            _write_holder(fd)
            return fd, None
        if time.monotonic() >= deadline:
            os.close(fd)
            return None, refusal(paths.root, holder(paths))
        if not waiting:
            log.info("waiting up to %.0f s for the launch holding %s to end (%s)", wait_s, paths.attempt_lock, holder(paths))
            waiting = True
        time.sleep(_POLL_S)


def held_by(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock (as `holder` says it), None when no launch does; for a process that never holds it.
    Probing takes the lock for an instant: a launch starting then waits, as for one that is ending."""
    paths = RunPaths(run_dir)
    try:
        fd = os.open(paths.attempt_lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no lock file: no launch yet; a link: the launch itself refuses it
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return holder(paths) if exc.errno in _HELD else None
    finally:
        os.close(fd)
    return None


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "job_id": os.environ.get("SLURM_JOB_ID", ""), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def holder(paths: RunPaths) -> str:
    """Who holds the run directory, for people: its pid, host, SLURM job and since when (as the holder wrote it)."""
    try:
        info = json.loads(paths.attempt_lock.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        job = f", SLURM job {info['job_id']}" if info["job_id"] else ""
        return f"pid {info['pid']} on {info['host']}{job}, since {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def refusal(run_dir: Path, who: str) -> str:
    """The paragraph that refuses a launch into `run_dir`, which `who` (as `holder` says it) holds."""
    paths = RunPaths(run_dir)
    return (
        f"Another launch is training in {paths.root} ({who}): it holds {paths.attempt_lock.name}. Two launches "
        "into one run directory would interleave their checkpoints and records. Wait for that launch to end or stop it "
        "(scancel its job, or kill its launcher), or give this launch its own run directory."
    )
