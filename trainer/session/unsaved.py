"""The Session's census of unsaved state: run it on every rank, say once on rank 0 what it found, refuse in strict mode.

The census (legato.state.census) runs when an attempt starts and at its first
and last checkpoints, at the same steps on every rank (each run is one small
exchange over the control group, so every rank reaches the same verdict). At
a checkpoint its scan runs in a thread while the checkpoint is written (the
write waits on the disk, the scan on the CPU: the stop at the time limit does
not wait for both in turn), and the exchange follows the commit. A
finding is told once per attempt: a warning paragraph on rank 0 and an
`UNSAVED_STATE` event; with `census="strict"` every rank then raises a
UsageError (exit 2). This module must never change what is saved: it only
names what is not.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from legato.dist.peers import Peers
from legato.errors import UsageError
from legato.events import Kind
from legato.session.telemetry import Telemetry
from legato.state.census import Finding, describe, find_unsaved

log = logging.getLogger(__name__)

MODES = ("warn", "strict", "off")


def check_mode(mode: str) -> str:
    """The census mode, or a UsageError naming the choices."""
    if mode not in MODES:
        raise UsageError(f"Session(census={mode!r}) is not one of {', '.join(MODES)}. Pass census=\"warn\" (the default: say what "
                         "legato does not save), \"strict\" (refuse to train) or \"off\".")
    return mode


class Census:
    """One rank's census of unsaved state, given what the Session registers (a callable: the set may grow)."""

    def __init__(self, peers: Peers, telemetry: Telemetry, mode: str, registered: Callable[[], list[Any]]) -> None:
        self.peers, self.telemetry, self.mode = peers, telemetry, check_mode(mode)
        self.registered = registered
        self._told: set[tuple[str, str]] = set()
        self._first_pending = True  # the census at the attempt's first checkpoint

    def check(self, step: int, when: str) -> None:
        """Collective: find unsaved state on every rank; tell what is new; in strict mode refuse it on every rank."""
        if self.mode == "off":
            return
        # The caller's frame: the user's loop is the next frame up that is not legato's.
        self._settle(step, when, self._scan(sys._getframe(1)))

    @contextlib.contextmanager
    def alongside(self, reason: str | None, step: int, frame: types.FrameType) -> Iterator[None]:
        """The census of the checkpoint (`reason`; None: none) the body writes, when due: the attempt's first and last
        checkpoints, the same steps on every rank. Collective then, after the body; its scan runs in a thread while the
        body runs. `frame`: the caller's, live until the body has run (the scan walks up from it)."""
        due = reason is not None and (self._first_pending or reason in ("signal", "final"))
        self._first_pending = self._first_pending and not due
        if not due or self.mode == "off":
            yield
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="legato-census") as pool:
            scanned = pool.submit(self._scan, frame)
            yield  # a body that raises leaves once the scan is done (the pool waits for it): no thread outlives the step
            mine = scanned.result()
        self._settle(step, reason, mine)

    def _scan(self, frame: types.FrameType) -> list[dict]:
        """This rank's findings as plain data; reads only (the objects, the frames from `frame` up, the collector's list)."""
        return [f.as_dict() for f in find_unsaved(self.registered(), frame=frame)]

    def _settle(self, step: int, when: str, mine: list[dict]) -> None:
        """Collective: merge every rank's findings; tell what is new; in strict mode refuse it on every rank."""
        merged: dict[tuple[str, str], dict] = {}
        for rank, items in enumerate(self.peers.gather(mine)):
            for item in items:
                merged.setdefault((item["type"], item["where"]), {**item, "ranks": []})["ranks"].append(rank)
        new = [item for key, item in merged.items() if key not in self._told]
        if not new:
            return
        self._told.update((item["type"], item["where"]) for item in new)
        text = describe([Finding(i["kind"], i["type"], i["where"], i["size"]) for i in new])
        strict = self.mode == "strict"
        self.telemetry.emit(Kind.UNSAVED_STATE, step=step, when=when, objects=new, strict=strict)
        if strict:
            raise UsageError(text + " Strict mode (determinism.mode: strict, Session(census=\"strict\")) refuses to train until each "
                             "is registered, changed or ignored.")
        if self.peers.rank == 0:
            at = "the start of this attempt" if when == "start" else f"the {when} checkpoint of step {step}"
            log.warning("%s (Found at %s.)", text, at)
