"""The Session's census of unsaved state: run it on every rank, say once on rank 0 what it found, refuse in strict mode.

The census (legato.state.census) runs when an attempt starts and at its first
and last checkpoints, at the same steps on every rank (each run is one small
exchange over the control group, so every rank reaches the same verdict). Each
look also takes the fingerprints of plain Python objects (legato.state.plain),
and one more look at the end of the attempt's first and second trained steps
(the exchange after the second): an object whose plain attributes changed
between two looks is named too (in strict mode refused after the second step,
before any checkpoint). Every finding's name goes into the manifest fields the
next checkpoints carry (`unregistered`), so a resume says what it verified
without. At a checkpoint its scan runs in a thread while the checkpoint is written (the
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
from concurrent.futures import wait
from typing import Any

from legato.dist.peers import Peers
from legato.errors import UsageError
from legato.events import Kind
from legato.session.telemetry import Telemetry
from legato.state.census import LOADER, Finding, describe, find_unsaved
from legato.state.plain import Print, changed, fingerprints, short_name
from legato.store.manifest_schema import UNREGISTERED_KEY
from legato.system.io_threads import io_submit

log = logging.getLogger(__name__)

MODES = ("warn", "strict", "off")
EARLY_LOOKS = 2  # plain-state looks at the end of the attempt's first trained steps (the exchange after the last)


def check_mode(mode: str) -> str:
    """The census mode, or a UsageError naming the choices."""
    if mode not in MODES:
        raise UsageError(
            f'Session(census={mode!r}) is not one of {", ".join(MODES)}. Pass census="warn" (the default: say what '
            'legato does not save), "strict" (refuse to train) or "off".'
        )
    return mode


class Census:
    """One rank's census of unsaved state, given what the Session registers (a callable: the set may grow)."""

    def __init__(
        self, peers: Peers, telemetry: Telemetry, mode: str, registered: Callable[[], list[Any]], carried: dict | None = None
    ) -> None:
        self.peers, self.telemetry, self.mode = peers, telemetry, check_mode(mode)
        self.registered = registered
        self.carried = carried if carried is not None else {}  # the manifest fields the next checkpoints carry
        self._told: set[tuple[str, str]] = set()
        self._first_pending = True  # the census at the attempt's first checkpoint
        self._prints: dict[str, Print] | None = None  # the last look at plain objects
        self._early: list[dict] = []  # plain findings of the early looks, exchanged after the last
        self._looks = 0  # early looks taken

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
        if reason is None or not due or self.mode == "off":  # (no reason is never due)
            yield
            return
        scanned = io_submit(self._scan, frame)
        try:
            yield
        finally:
            wait([scanned])  # a body that raises leaves once the scan is done: nothing of it outlives the step
        self._settle(step, reason, scanned.result())

    @property
    def looking(self) -> bool:
        """Whether early looks are still to come (the next trained step's boundary takes one)."""
        return self.mode != "off" and self._looks < EARLY_LOOKS

    def early_look(self, step: int, frame: types.FrameType) -> None:
        """At the end of each of the attempt's first EARLY_LOOKS trained steps: look at plain objects; collective at the last."""
        if not self.looking:
            return
        self._looks += 1
        self._early += self._plain_changes(frame)
        if self._looks == EARLY_LOOKS:
            found, self._early = self._early, []
            self._settle(step, "early", found)

    def _scan(self, frame: types.FrameType) -> list[dict]:
        """This rank's findings as plain data; reads only (the objects, the frames from `frame` up, the collector's list)."""
        early, self._early = self._early, []  # the early looks' findings, when a stop came before their exchange
        return [f.as_dict() for f in find_unsaved(self.registered(), frame=frame)] + early + self._plain_changes(frame)

    def _plain_changes(self, frame: types.FrameType) -> list[dict]:
        """The plain objects whose attributes changed since the last look (none at the first), as plain data."""
        before, self._prints = self._prints, fingerprints(self.registered(), frame)
        return [] if before is None else [f.as_dict() for f in changed(before, self._prints)]

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
        named = {short_name(i["where"]) for i in new if i["kind"] != LOADER}
        self.carried[UNREGISTERED_KEY] = sorted(set(self.carried.get(UNREGISTERED_KEY, [])) | named)
        text = describe([Finding(i["kind"], i["type"], i["where"], i["size"]) for i in new])
        strict = self.mode == "strict"
        self.telemetry.emit(Kind.UNSAVED_STATE, step=step, when=when, objects=new, strict=strict, names=sorted(named))
        if strict:
            raise UsageError(
                text + ' Strict mode (determinism.mode: strict, Session(census="strict")) refuses to train until each '
                "is registered, changed or ignored."
            )
        if self.peers.rank == 0:
            at = {"start": "the start of this attempt", "early": f"the attempt's first steps (step {step})"}.get(
                when, f"the {when} checkpoint of step {step}"
            )
            log.warning("%s (Found at %s.)", text, at)
