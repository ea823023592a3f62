"""The periodic checkpoint writer's interface, one definition for both drivers, and the synchronous driver.

A Session writes each periodic checkpoint through one `Writer`: the background one
(`legato.store.async_checkpoint.AsyncCheckpointer`: the loop waits for a memory copy, a worker writes, a later agreed
boundary commits) or `Synchronous` here, which stages nothing and has nothing in flight, so that the loop writes the
checkpoint itself from the live state (`legato.store.checkpoint.write_checkpoint`, as it writes every stop and final
checkpoint with either driver). The phases, in the order the Session asks them at a step boundary:

1. `votes()`: this rank's side of the ranks' agreement (legato.dist.stop): a write still running, or failed;
2. `settle(decision)`: what the write in flight became at the agreed step (committed, abandoned, or not yet);
3. when a periodic checkpoint is due: `make_room(step)` (wait for one still in flight: at most one), then
   `stage(step, parts, files)`, the blocking copy of this rank's files (`files()` lays them out, asked only by a
   writer that copies; None: nothing staged, the loop writes from the live state), then `start(job)`;
4. before any synchronous checkpoint: `finish()`, so that checkpoints publish in step order;
5. `close()` when the rank leaves.

Besides, the replay base shares buffers with the writer: `lend_staged(step, swap)` hands it the copy staged at its
step, and `release(buffer)` waits until the writer no longer reads a buffer about to be reused.
Outcomes: a `Committed` checkpoint, a `NotWritten` one (nothing published), or None (nothing to report).
This module must never write a file, touch the process group or decide when a checkpoint is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from legato.dist.stop import Decision
from legato.state.snapshot import Snapshot
from legato.store.async_checkpoint import Job
from legato.store.commit import Committed, NotWritten

Outcome = Committed | NotWritten | None
# This rank's files of the live state (file name -> content) and which of them hold replicated state.
Files = Callable[[], tuple[dict[str, Any], set[str]]]


class Writer(Protocol):
    """One rank's periodic checkpoint driver (phases in the module's docstring)."""

    def votes(self) -> dict[str, bool]: ...

    def settle(self, decision: Decision) -> Outcome: ...

    def make_room(self, step: int) -> Outcome: ...

    def stage(self, step: int, parts: dict[str, Any], files: Files) -> Snapshot | None: ...

    def start(self, job: Job) -> None: ...

    def finish(self) -> Outcome: ...

    def lend_staged(self, step: int, swap: Callable[[Snapshot], Snapshot]) -> bool: ...

    def release(self, buffer: Snapshot) -> None: ...

    def close(self) -> None: ...


class Synchronous:
    """The trivial driver: nothing staged, nothing in flight, settled at every boundary; the loop writes the
    checkpoint from the live state and waits for the disk."""

    def votes(self) -> dict[str, bool]:
        return {}

    def settle(self, decision: Decision) -> Outcome:
        return None

    def make_room(self, step: int) -> Outcome:
        return None

    def stage(self, step: int, parts: dict[str, Any], files: Files) -> Snapshot | None:
        return None

    def start(self, job: Job) -> None:
        raise AssertionError("the synchronous writer stages nothing, so it has no job to start")

    def finish(self) -> Outcome:
        return None

    def lend_staged(self, step: int, swap: Callable[[Snapshot], Snapshot]) -> bool:
        return False

    def release(self, buffer: Snapshot) -> None:
        return None

    def close(self) -> None:
        return None
