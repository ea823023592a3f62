"""Children die with their parent: a rank with its launcher, a DataLoader worker with its rank.

Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) is set from inside
the child; because the parent may already have died before that call, the
child then checks that its parent is still the one it expects and exits if
not. Without this a SIGKILLed launcher leaves its ranks (and their workers)
training on, holding ports, GPUs and the run directory. Elsewhere than Linux
this is a no-op. This module must never do anything but arm the signal.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
LAUNCHER_PID = "LEGATO_LAUNCHER_PID"


def die_with_parent(expected_parent: int | None = None, sig: signal.Signals = signal.SIGKILL) -> None:
    """Arm `sig` for when the parent dies; exit now if the parent is already gone (or is not `expected_parent`)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
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
