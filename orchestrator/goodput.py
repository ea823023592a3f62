"""Where a run's time went, per attempt and in all, from its ledger: goodput and the buckets of the rest.

Each attempt's span, from the end of the one before it (or the run's first record) to its own end, is cut into:

- queued: before its launch (in the queue, or between a script's launches);
- starting: from its launch (rank 0's process start, `launched_at`) to its first step (the `bucket_layout` record,
  written once the restore is done): imports, the process group, choosing, reading and checking the checkpoint;
- replay: the replay that proved its resume (`resumed.replay.seconds`);
- checkpoint: what its checkpoints blocked the loop (the `seconds` of every checkpoint not written in the background);
- lost: the steps it trained past its last checkpoint and a kill threw away (the next attempt's `work_lost`), at its
  own mean step time (its replay's, when it was killed before it trained a step); an attempt that died is taken to
  have ended that long after its last record, and at the latest when the next attempt launched;
- training: the rest, the steps that count.

Goodput is training over the run's wall time, the sum of every bucket. The stop's margin (the time limit, when the
scheduler told it as SLURM_JOB_END_TIME, less the stop checkpoint's commit) is told beside the buckets, not in them.
Times are the ledger's own (each record's `time`, written when it happened), so the buckets add up to the wall time
by construction; what they can get wrong is where a line between two of them falls: a checkpoint's `seconds` are
the writer's (a synchronous one's blocking time within milliseconds), and a killed attempt's lost time is an estimate
from its step rate. This module must never read a file or a clock: `legato status` hands it the records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from legato.events import Kind

BUCKETS = ("queued", "starting", "replay", "checkpoint", "lost", "training")
# The records that start a run's clock: a `legato run` (the supervisor's first record, its submission), else the first
# attempt's launch.
RUN_START = (Kind.RUN_STARTED.value, Kind.SUBMITTED.value)


@dataclass
class Spent:
    """Seconds of one attempt (or a whole run) by bucket, and the stop's margin to the time limit where known."""

    queued: float = 0.0
    starting: float = 0.0
    replay: float = 0.0
    checkpoint: float = 0.0
    lost: float = 0.0
    training: float = 0.0
    margin_s: float | None = None

    @property
    def wall(self) -> float:
        return sum(getattr(self, name) for name in BUCKETS)

    @property
    def goodput(self) -> float | None:
        """Training over wall time (None for no time at all)."""
        return self.training / self.wall if self.wall > 0 else None

    def add(self, other: Spent) -> None:
        for name in BUCKETS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_json(self) -> dict:
        data = {name: round(value, 3) for name, value in asdict(self).items() if name in BUCKETS}
        return {
            **data,
            "wall_s": round(self.wall, 3),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "margin_s": self.margin_s,
        }


@dataclass
class AttemptClock:
    """What one attempt's records say of its time."""

    launched: float
    records: list[dict] = field(default_factory=list)

    def first(self, kind: Kind) -> dict | None:
        return next((r for r in self.records if r["event"] == kind), None)

    @property
    def last_time(self) -> float:
        return max([self.launched, *(r["time"] for r in self.records)])


def run_start(events: Iterable[dict]) -> float | None:
    """When the run's clock starts: its first `run_started` or `submitted` record, if any."""
    return next((e["time"] for e in events if e["event"] in RUN_START), None)


def attempt_spent(
    clock: AttemptClock, since: float, lost_steps: int, steps_run: int, next_launch: float | None = None
) -> tuple[Spent, float]:
    """One attempt's buckets from `since` (the end of the attempt before it, or the run's start), and its end: never
    past `next_launch`, the next attempt's launch (a killed attempt's end is an estimate)."""
    spent = Spent(queued=max(0.0, clock.launched - since))
    layout = clock.first(Kind.BUCKET_LAYOUT)
    last = clock.last_time
    if layout is None:  # it never reached a step
        spent.starting = last - clock.launched
        return spent, last
    spent.starting = max(0.0, layout["time"] - clock.launched)
    resumed = clock.first(Kind.RESUMED)
    replay = (resumed or {}).get("replay") or {}
    spent.replay = float(replay.get("seconds") or 0.0)
    spent.checkpoint = sum(
        float(r["seconds"]) for r in clock.records if r["event"] == Kind.CHECKPOINT_COMMITTED and not r.get("background")
    )
    stepping = max(0.0, last - layout["time"] - spent.replay - spent.checkpoint)
    spent.lost = _step_s(stepping, steps_run, replay) * lost_steps
    if next_launch is not None:
        spent.lost = min(spent.lost, max(0.0, next_launch - last))
    spent.training = stepping
    spent.margin_s = _margin(clock)
    return spent, last + spent.lost


def _step_s(stepping: float, steps_run: int, replay: dict) -> float:
    """The attempt's mean step time: from its steps past the resume, else (killed before it trained one) its replay's."""
    if steps_run > 0:
        return stepping / steps_run
    replayed = int(replay.get("steps") or 0)
    return float(replay.get("seconds") or 0.0) / replayed if replayed else 0.0


def _margin(clock: AttemptClock) -> float | None:
    """Seconds from the stop checkpoint's commit to the time limit, when the attempt knew its limit and stopped."""
    started = clock.first(Kind.ATTEMPT_STARTED) or {}
    stop = next((r for r in clock.records if r["event"] == Kind.CHECKPOINT_COMMITTED and r.get("reason") == "signal"), None)
    if stop is None or not started.get("ends_at"):
        return None
    return round(float(started["ends_at"]) - stop["time"], 3)
