"""Agreed stop: a signal only sets a flag; the ranks agree on the step to stop after.

At every step boundary each rank starts a non-blocking MAX all-reduce of its
local flags and reads the one it started at the previous boundary, so the
collective's latency hides behind a whole step and every rank reaches the
same decision after the same step, whichever rank got the signal and when.
The same all-reduce carries a "periodic checkpoint is due by the clock" flag,
because wall clocks differ between ranks. The signal handler must never do
anything but set the flag: no I/O, no collectives, no checkpointing.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """What every rank agreed on at one step boundary."""

    stop: bool
    checkpoint_due: bool


class StopFlag:
    """Installs the stop-signal handler and remembers when the signal first came."""

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self.signals = signals
        self.received_at: float | None = None
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Callable | int | None] = {}

    def install(self) -> None:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def raised(self) -> bool:
        return self.received_at is not None

    def _handle(self, signum: int, frame: object) -> None:
        if self.received_at is None:
            self.received_at = time.time()
            self.signum = signum


class StopAgreement:
    """One non-blocking all-reduce per step boundary; each decision is read one step later."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def boundary(self, stop_local: bool, checkpoint_due_local: bool) -> Decision:
        """Start this boundary's all-reduce and return the decision from the previous one."""
        flags = torch.tensor([int(stop_local), int(checkpoint_due_local)], dtype=torch.int32)
        if self.group is None:
            return Decision(stop=stop_local, checkpoint_due=checkpoint_due_local)
        decision = self._collect()
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, flags)
        return decision

    def drain(self) -> None:
        """Finish the outstanding all-reduce (before a collective-free exit or teardown)."""
        self._collect()

    def _collect(self) -> Decision:
        if self._pending is None:
            return Decision(stop=False, checkpoint_due=False)
        work, flags = self._pending
        self._pending = None
        work.wait()
        return Decision(stop=bool(flags[0]), checkpoint_due=bool(flags[1]))


def parse_signal(name: str) -> signal.Signals:
    return signal.Signals[f"SIG{name.upper().removeprefix('SIG')}"]
