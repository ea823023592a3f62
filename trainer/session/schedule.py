"""When a periodic checkpoint is due: every `checkpoint.every_steps` steps, every `checkpoint.every_minutes` by this
rank's clock, or at the interval chosen from evidence (`every_minutes: auto`, legato.session.spacing).

A rank's clock only votes: the ranks agree at a step boundary whether a checkpoint is due by the clock
(legato.dist.stop), because wall clocks differ between ranks. Under auto the interval is chosen at the attempt's first
vote (once its start is in the ledger) and again after each periodic checkpoint, from what that checkpoint blocked the
loop, and recorded (`checkpoint_interval`) when it is new or moved. This module must never touch the state, write a
checkpoint or start a collective.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable

from legato.config import AUTO, CheckpointSection
from legato.events import Kind
from legato.session import spacing
from legato.session.telemetry import Telemetry

log = logging.getLogger(__name__)


class Schedule:
    """One rank's periodic checkpoint schedule: by steps, by its clock, or auto."""

    def __init__(
        self,
        policy: CheckpointSection,
        telemetry: Telemetry,
        rank: int,
        failures: Callable[[], tuple[int, float]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`failures`: the unannounced failures the run's ledger records and the seconds since its first record (auto
        reads them each time it chooses). `clock`: seconds, monotonic (a fake in unit tests)."""
        self.policy, self.telemetry, self.rank, self.failures, self.clock = policy, telemetry, rank, failures, clock
        self.auto = policy.every_minutes == AUTO
        self.interval: spacing.Interval | None = None  # auto's, chosen at the attempt's first vote
        self._costs: collections.deque[float] = collections.deque(maxlen=spacing.COSTS_KEPT)  # auto: newest last
        self._recorded: spacing.Interval | None = None  # the interval recorded last (auto)
        self._last_save = clock()

    @property
    def interval_s(self) -> float:
        """Seconds between periodic checkpoints by the clock (0: none)."""
        if self.interval is not None:
            return self.interval.seconds
        return 60 * float(self.policy.every_minutes)

    def clock_due(self) -> bool:
        """This rank's vote: a full interval has passed since the last checkpoint (or the attempt's start)."""
        if self.auto and self.interval is None:
            self._choose(None)
        every_s = self.interval_s
        return every_s > 0 and self.clock() - self._last_save >= every_s

    def due_by_steps(self, step: int) -> bool:
        """Whether `step` is one of `every_steps`'s (the same on every rank: no vote)."""
        return bool(self.policy.every_steps) and step % self.policy.every_steps == 0

    def saved(self) -> None:
        """A checkpoint was written, or tried and not written: the next is due a full interval from now."""
        self._last_save = self.clock()

    def blocked(self, seconds: float) -> None:
        """A periodic checkpoint blocked the loop `seconds`: under auto, the interval is chosen again."""
        if not self.auto:
            return
        self._costs.append(seconds)
        self._choose(statistics.median(self._costs))

    def _choose(self, blocked_s: float | None) -> None:
        """Choose auto's interval from the median of the newest costs (None: none measured yet) and the failures the
        ledger records now; record it when it is new or moved."""
        self.interval = spacing.choose(blocked_s, *self.failures())
        if not spacing.worth_recording(self.interval, self._recorded):
            return
        self._recorded = self.interval
        self.telemetry.emit(Kind.CHECKPOINT_INTERVAL, **dataclasses.asdict(self.interval))
        log.info("rank %d: periodic checkpoints every %.1f minutes (every_minutes: auto)", self.rank, self.interval.minutes)
