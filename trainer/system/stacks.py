"""Every thread's Python stack of a process on this node, on request, even when that process is stuck.

`arm()` gives this process (and, through a fork hook, every child it forks:
DataLoader workers) an anonymous in-memory file and registers faulthandler to
write all threads' stacks into it on `DUMP_SIGNAL`. faulthandler writes from
its C signal handler, so a process whose main thread waits in a collective,
holds a lock for ever or spins in C still answers. `collect(pid)` then sends
the signal and reads the process's answer through /proc (the same user's
processes only); a stopped process is continued to answer and stopped again:
its stack is where it was stopped. Nothing is written to disk here; the caller decides where stacks go.

This module must never import torch or run in a signal handler of its own: it
is read by the hang watchdog while the rank it serves may be wedged.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import time
from pathlib import Path

from legato.system.processes import stat_fields

log = logging.getLogger(__name__)

# A real-time signal: no default meaning a library relies on (glibc keeps the ones below SIGRTMIN for itself).
DUMP_SIGNAL = signal.SIGRTMIN + 6
MEMFD_NAME = "legato-stacks"
ANSWER_WAIT_S = 3.0  # how long a process gets to write its stacks once signalled
SETTLE_S = 0.5  # an answer counts as complete once it stopped growing this long (a loaded machine pauses a writer)

_armed_pid: int | None = None
_answer_fd: int | None = None


def arm() -> None:
    """Have this process, and every process it forks from now on, answer `DUMP_SIGNAL` with its stacks (idempotent)."""
    global _armed_pid
    if _armed_pid == os.getpid():
        return
    first = _armed_pid is None
    _register()
    if first:
        os.register_at_fork(after_in_child=_rearm_child)


def _register() -> None:
    global _armed_pid, _answer_fd
    fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
    faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True, chain=False)
    inherited, _answer_fd, _armed_pid = _answer_fd, fd, os.getpid()
    if inherited is not None:
        # The parent's file, shared since the fork: a reader must find only this process's own.
        os.close(inherited)


def _rearm_child() -> None:
    """In a forked child (a DataLoader worker): its own file, so its answer is not written into its parent's."""
    if _armed_pid is None:
        return
    try:
        _register()
    except OSError as exc:  # out of file descriptors: the child still works, its stacks just cannot be asked for
        log.debug("stack dumps not armed in pid %d: %s", os.getpid(), exc)


def answer_file(pid: int) -> Path | None:
    """The /proc path of the process's stack file, or None when it has none (not armed, gone, not ours)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fds.iterdir())
    except OSError:
        return None
    for entry in entries:
        with contextlib.suppress(OSError):
            if os.readlink(entry).startswith(f"/memfd:{MEMFD_NAME}"):
                return entry
    return None


def stopped(pid: int) -> bool:
    """True when `pid` is stopped by a signal (SIGSTOP, SIGTSTP) or a tracer."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def collect(pid: int, wait_s: float = ANSWER_WAIT_S) -> str | None:
    """Every thread's stack of process `pid` (armed, same user), or None when it cannot answer within `wait_s`.

    A stopped process cannot answer: it is sent the request first, then continued (SIGCONT), so that it answers before
    running anything else, and stopped again once it answered; the caller finds it as it was.
    """
    path = answer_file(pid)
    if path is None:
        return None
    before, was_stopped = _size(path), stopped(pid)
    try:
        os.kill(pid, DUMP_SIGNAL)
        if was_stopped:
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return None
    try:
        return _read_answer(path, before, wait_s)
    finally:
        if was_stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)


def _read_answer(path: Path, before: int, wait_s: float) -> str | None:
    deadline = time.monotonic() + wait_s
    size, grew_at = before, time.monotonic()
    while time.monotonic() < deadline:
        now_size = _size(path)
        if now_size != size:
            size, grew_at = now_size, time.monotonic()
        elif size > before and time.monotonic() - grew_at >= SETTLE_S:
            break
        time.sleep(0.02)
    if size <= before:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(before)
            return f.read(size - before).decode(errors="replace")
    except OSError:
        return None


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
