"""Checkpoint spacing from evidence: the periodic interval under `every_minutes: auto`, by Young-Daly.

The interval that minimizes what a run loses to its checkpoints plus the work a failure throws away is about
sqrt(2 x C x M) (Young 1974, Daly 2006): C the seconds a periodic checkpoint blocks the loop, M the mean time between
failures. C is measured: the median of this attempt's newest COSTS_KEPT periodic checkpoints as the loop waited for
them (the first also waits for the census of unsaved state; one slow disk moment does not move the interval alone). M is estimated
from the run's ledger: the interruptions nobody announced that it recorded (a kill that lost work, a hang, a lost rank)
over the time since the run's first record, with a prior of one failure every PRIOR_MTBF_H hours counted as one
observation, so a young run that has not failed yet is not told it never fails, and each failure moves the estimate.
Until this attempt has measured a periodic checkpoint the interval is UNMEASURED_MINUTES (every_minutes's default),
and it is always within [MIN_MINUTES, MAX_MINUTES]. This module must never read a clock, a file or the environment:
the Saver hands it the cost, the records and the time, and records what it chose.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from legato.events import Kind

# One unannounced failure a day per job, before the run has seen any: between Meta's published rates for a job of
# 1,024 GPUs (one every 7.9 h) and the rarer failures of the small jobs most users run.
PRIOR_MTBF_H = 24.0
# A checkpoint more often than every 2 minutes is a sign of a cost measured on a quiet moment, not a plan; more rarely
# than every 2 hours, a failure loses more than a short job's whole allocation.
MIN_MINUTES, MAX_MINUTES = 2.0, 120.0
UNMEASURED_MINUTES = 10.0
# Interruptions nobody announced: what Young-Daly's M counts. A stop at the time limit or a preemption is announced and
# loses nothing.
FAILURES = frozenset({Kind.WORK_LOST.value, Kind.HANG.value, Kind.RANK_LOST.value})
COSTS_KEPT = 5
# A new interval is recorded when it moved this much from the one recorded last.
RECORD_CHANGE = 0.2


@dataclass(frozen=True)
class Interval:
    """The periodic interval chosen, and what it was chosen from (the fields of a `checkpoint_interval` record)."""

    minutes: float
    cost_s: float | None  # the measured checkpoint cost; None before one
    mtbf_hours: float
    failures: int
    run_hours: float
    young_daly_minutes: float | None  # the formula's value before the bounds; None before a measured cost

    @property
    def seconds(self) -> float:
        return 60 * self.minutes


def failures_since_start(records: Iterable[dict], now: float) -> tuple[int, float]:
    """The unannounced failures a run's ledger records, and the seconds from its first record to `now` (a Unix time)."""
    records = list(records)
    first = min((r["time"] for r in records if isinstance(r.get("time"), (int, float))), default=now)
    return sum(1 for r in records if r.get("event") in FAILURES), max(0.0, now - first)


def choose(cost_s: float | None, failures: int, run_s: float) -> Interval:
    """The interval for a checkpoint that blocks `cost_s` seconds, in a run that saw `failures` in `run_s` seconds."""
    mtbf_s = (run_s + 3600 * PRIOR_MTBF_H) / (failures + 1)
    young_daly = None if cost_s is None else math.sqrt(2 * max(cost_s, 0.0) * mtbf_s) / 60
    minutes = UNMEASURED_MINUTES if young_daly is None else min(MAX_MINUTES, max(MIN_MINUTES, young_daly))
    return Interval(
        minutes=round(minutes, 3),
        cost_s=None if cost_s is None else round(cost_s, 3),
        mtbf_hours=round(mtbf_s / 3600, 3),
        failures=failures,
        run_hours=round(run_s / 3600, 3),
        young_daly_minutes=None if young_daly is None else round(young_daly, 3),
    )


def worth_recording(new: Interval, recorded: Interval | None) -> bool:
    """Whether `new` is recorded: the first measured one, or one that moved by RECORD_CHANGE or more."""
    if recorded is None:
        return True
    if recorded.cost_s is None:
        return new.cost_s is not None
    return abs(new.minutes - recorded.minutes) >= RECORD_CHANGE * recorded.minutes
