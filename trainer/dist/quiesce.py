"""A rank's exit waits for gloo's worker threads to let go of their last work, so a clean stop does not abort.

A gloo process group runs each collective on a worker thread (`pt_gloo_runloop`),
which drops its hold on the finished work a moment after the caller's `wait()`
returned. When that hold is the last one on a tensor that once had a Python
object, dropping it takes the GIL. If the interpreter is finalizing by then,
Python ends the thread from under C++ code and the rank dies of SIGABRT
(`terminate called without an active exception`) after it committed its
checkpoint and chose its exit code: a launcher counts the requeue-able stop as
a crash. On a loaded machine the worker can stay descheduled long enough for
the script to finish; a core of such a rank shows exactly this, in
`~AsyncAllgatherCoalescedWork` on the world group that an FSDP2 model keeps
alive past `destroy_process_group()`.

`wait_at_exit` registers, once per process, an exit hook that runs before the
interpreter finalizes: it releases the GIL in short sleeps until every gloo
worker thread has been seen parked (sleeping, not runnable) several times in a
row, for at most a few seconds. A worker that waits for the GIL gets it during
those sleeps and parks again. This module must never wait on a collective or
touch a process group: a worker stuck on a lost peer looks parked, and the exit
goes on.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from pathlib import Path

from legato.system.processes import stat_fields

log = logging.getLogger(__name__)

WORKER_THREAD = "pt_gloo_runloop"
# Consecutive looks at which every worker must be parked, and the pause between looks (the GIL is free meanwhile).
PARKED_LOOKS = 3
LOOK_EVERY_S = 0.01
# The most an exit waits: a worker that stays runnable this long is left to the interpreter's shutdown as before.
WAIT_AT_MOST_S = 5.0
TASKS = Path("/proc/self/task")

_registered = False


def wait_at_exit() -> None:
    """Register the exit hook (once per process; elsewhere than Linux, where threads cannot be read, never)."""
    global _registered
    if _registered or not TASKS.is_dir():
        return
    atexit.register(settle)
    _registered = True


def settle(timeout_s: float = WAIT_AT_MOST_S) -> None:
    """Sleep in short steps until every gloo worker thread was parked at PARKED_LOOKS looks in a row, or `timeout_s` passed."""
    deadline, parked = time.monotonic() + timeout_s, 0
    while parked < PARKED_LOOKS:
        states = worker_states()
        if not states:
            return
        parked = parked + 1 if all(state == "S" for state in states) else 0
        if time.monotonic() >= deadline:
            log.debug("gloo worker threads still runnable at exit after %.1fs: %s", timeout_s, states)
            return
        time.sleep(LOOK_EVERY_S)


def worker_states() -> list[str]:
    """The scheduler state letter (R running or runnable, S sleeping, ...) of each of this process's gloo worker threads."""
    states = []
    for task in os.listdir(TASKS):
        try:
            worker = (TASKS / task / "comm").read_text().strip() == WORKER_THREAD
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = stat_fields(int(task)) if worker else None
        if fields is not None:
            states.append(fields[0])
    return states
