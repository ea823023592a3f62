"""Children die with their parent: a rank with its launcher, a DataLoader worker with its rank.

Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) is set from inside
the child; because the parent may already have died before that call, the
child then checks that its parent is still the one it expects and exits if
not. Without this a SIGKILLed launcher leaves its ranks (and their workers)
training on, holding ports, GPUs and the run directory. Elsewhere than Linux
this is a no-op. A process whose parent is not the one it must die with (a
DataLoader worker started by a `forkserver`, whose fork server outlives the
rank as long as any worker holds its pipe) watches that process through a
pidfd instead. This module must never do anything but arm the signal or the
watch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
LAUNCHER_PID = "LEGATO_LAUNCHER_PID"
# Resolved once, when the rank imports this module: a DataLoader worker started by `fork` from a rank whose other
# threads (the checkpoint writer, gloo's, torch's) may hold the dynamic loader's lock at that instant must neither
# dlopen nor dlsym, nor run `ldconfig` as ctypes.util.find_library does; it only calls this.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def armed_child(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that arms `sig` in the child before it execs (PR_SET_PDEATHSIG survives
    exec), then exits the child if this process already died in between; None elsewhere than Linux.

    libc's prctl was looked up when this module was imported: between fork and exec the child only calls it.
    """
    prctl, parent = _PRCTL, os.getpid()
    if prctl is None:
        return None

    def arm() -> None:
        # A failure cannot be logged here; the child's own `die_with_parent` arms again and warns.
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + int(sig))

    return arm


def die_with_parent(expected_parent: int | None = None, sig: signal.Signals = signal.SIGKILL) -> None:
    """Arm `sig` for when the parent dies; exit now if the parent is already gone (or is not `expected_parent`)."""
    if _PRCTL is None:
        return
    if _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); this process may outlive its parent", ctypes.get_errno())
        return
    parent = os.getppid()
    if parent == 1 or (expected_parent is not None and parent != expected_parent):
        os._exit(128 + int(sig))


def die_with_launcher() -> None:
    """For a rank started by the local launcher, which names itself in the environment."""
    expected = os.environ.get(LAUNCHER_PID)
    if expected and expected.isdigit():
        die_with_parent(int(expected))


def die_with_process(pid: int) -> None:
    """Exit at once when process `pid` (not necessarily the parent) ends; exit now if it is already gone.

    A daemon thread waits on a pidfd, so the watch costs nothing while `pid` lives and cannot be fooled by a
    reused pid. Without pidfds (Linux before 5.3, other systems) this is a no-op.
    """
    if not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(128 + int(signal.SIGKILL))
    except OSError as e:
        log.warning("pidfd_open(%d) failed (%s); this process may outlive it", pid, e)
        return
    threading.Thread(target=_exit_when_readable, args=(fd,), name="legato-lifeline", daemon=True).start()


def _exit_when_readable(fd: int) -> None:
    select.select([fd], [], [])
    os._exit(128 + int(signal.SIGKILL))
