"""A local job's ranks, forked warm from its one submitit task.

On Linux submitit's LocalExecutor starts one task (`legato.slurm.submission.local_executor`), and that task forks
the config's `local.tasks` ranks once it has imported what every rank imports (torch, what DDP imports as it wraps
a model, legato's trainer), where submitit would start each rank as a fresh interpreter that imports it all again:
about 5 s of CPU a rank and attempt on a small machine. Each rank is then what a task of its own was: its own pid
(recorded in the ledger, signalled by pid), submitit's environment for its rank (`SUBMITIT_LOCAL_GLOBALID`,
`SUBMITIT_LOCAL_LOCALID`, `SUBMITIT_LOCAL_NTASKS`), its own `%j_%t_log.out`/`.err`, the signal mask and handlers
the task started with, a numpy generator drawn from the OS, death with its parent. The task forwards to every rank
what submitit's controller sends a task (its time-limit signal, SIGTERM, and SIGINT as it stops the job) and exits
with submitit's requeue code when a rank does, so that the controller restarts the job as it did its tasks.

It must never fork with a thread of its own running, never decide anything a rank decides (each rank runs the
job side unchanged), and never stop a rank that is still running: like the controller, it waits for all of them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterable

import submitit

from legato.system.forking import ForkedProcess, fork_run, fresh_numpy_seed, name_this_process
from legato.system.lifeline import die_with_parent

log = logging.getLogger(__name__)

POLL_S = 0.05
FORWARDED = (signal.SIGINT, signal.SIGTERM)  # what the controller sends a task besides its time-limit signal


def run_ranks(count: int, signals: Iterable[signal.Signals], rank: Callable[[], object], requeue_code: int) -> int:
    """Fork `count` ranks that each run `rank` (which returns when the rank finished and exits otherwise), forward
    `signals` and the controller's own to them, and wait for all; the task's exit code: `requeue_code` when any rank
    exited with it, else 0 when every rank finished, else the first other code in rank order."""
    _preload()
    forwarded = {*signals, *FORWARDED, submitit.JobEnvironment._usr_sig()}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)  # held while forking; each rank gets the task's own mask
    ranks: list[ForkedProcess] = []
    try:
        for index in range(count):
            ranks.append(fork_run([f"legato-rank{index}"], _becoming(index, count, mask), _running(rank)))
        for sig in forwarded:
            signal.signal(sig, lambda signum, frame: _forward(ranks, signum))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask - forwarded)
        return _task_code([r.wait() for r in _waiting(ranks)], requeue_code)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _preload() -> None:
    """What each rank would import again, as `python -m legato` preloads it; none of it starts a thread."""
    from legato.runtime.launch import preloaded_rank  # torch: the supervisor imports this module too

    preloaded_rank()


def _becoming(index: int, count: int, mask: set[int | signal.Signals]) -> Callable[[], None]:
    """What rank `index` of `count` runs first: the task's signal mask, submitit's environment for its rank, its name
    and its own logs (rank 0 keeps the task's, which the controller opened)."""

    parent = os.getpid()

    def become() -> None:
        die_with_parent(parent)  # a fork clears the parent-death signal, and the task may be gone already
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ.update(SUBMITIT_LOCAL_GLOBALID=str(index), SUBMITIT_LOCAL_LOCALID=str(index), SUBMITIT_LOCAL_NTASKS=str(count))
        name_this_process(f"legato-rank{index}")  # its command line is the task's: `ps -o pid,comm` tells the ranks apart
        if index:
            paths = submitit.JobEnvironment().paths
            _write_to(paths.stdout, 1)
            _write_to(paths.stderr, 2)
        fresh_numpy_seed()

    return become


def _write_to(path: os.PathLike, fd: int) -> None:
    """File descriptor `fd` appended to `path`, as the controller opens a task's log."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _running(rank: Callable[[], object]) -> Callable[[], int]:
    """A rank's run: 0 when `rank` returned; an exception is printed, as submitit prints a task's, and exits 1 here
    rather than unwinding into submitit's handler in the task's frames (which would write the task's result)."""

    def run() -> int:
        try:
            rank()
        except Exception:
            traceback.print_exc()
            return 1
        return 0

    return run


def _forward(ranks: list[ForkedProcess], signum: int) -> None:
    for r in ranks:
        r.send_signal(signum)


def _waiting(ranks: list[ForkedProcess]) -> list[ForkedProcess]:
    """`ranks`, once every one has ended (polled: a signal to forward interrupts no wait)."""
    while any(r.poll() is None for r in ranks):
        time.sleep(POLL_S)
    return ranks


def _task_code(codes: list[int], requeue_code: int) -> int:
    if requeue_code in codes:
        return requeue_code
    failed = [c for c in codes if c != 0]
    if not failed:
        return 0
    log.info("local ranks exited with %s", codes)
    return failed[0] if failed[0] > 0 else 128 - failed[0]
