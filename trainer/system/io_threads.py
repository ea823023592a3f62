"""The process's long-lived I/O threads: checkpoint files are written and read on them, never on threads made per call.

A thread that ends while another thread forks can leave the child stuck in `fork()`: CPython 3.11's child frees
the parent's other thread states (`PyOS_AfterFork_Child`), through locks such a thread may hold at that instant,
and `join()` returns before an ending thread has let go of them. A DataLoader forks its workers right after a
resume's parallel reads (an epoch's first batch), and while a background checkpoint writes: one launch in a few
hundred hung there, a worker in `fork()` and its rank waiting for it. So these threads start once per process, all
together, before the training loop's loaders fork (`start`, which the Session calls first), and end only with the
process: around a step no thread of legato's starts or ends.

It must never run anything that blocks on the training loop (a collective, a lock the loop holds): only calls that
read, write, hash or scan and then return.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

THREADS = 8  # the most files a rank reads or writes at once that still gain from overlapping (more queue)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_owner = 0  # the pid that started `_pool`: a forked child has the object, not its threads

Item = TypeVar("Item")
Result = TypeVar("Result")


def start() -> ThreadPoolExecutor:
    """This process's pool, every thread of it running (started here once; a forked child starts its own)."""
    global _pool, _owner
    with _lock:
        if _pool is None or _owner != os.getpid():
            _pool, _owner = _started(), os.getpid()
        return _pool


def io_map(fn: Callable[[Item], Result], items: Iterable[Item]) -> list[Result]:
    """`fn` over `items` on the I/O threads, at most THREADS at once; the results in order."""
    return list(start().map(fn, items))


def io_submit(fn: Callable[..., Result], *args: Any) -> Future[Result]:
    """`fn(*args)` on an I/O thread; its future."""
    return start().submit(fn, *args)


def _started() -> ThreadPoolExecutor:
    """A pool whose THREADS threads are all running: the executor starts one per task it cannot hand to an idle thread,
    so THREADS tasks that wait for each other start them all now, not later beside a fork."""
    pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="legato-io")
    together = threading.Barrier(THREADS)
    for future in [pool.submit(together.wait) for _ in range(THREADS)]:
        future.result()
    return pool
