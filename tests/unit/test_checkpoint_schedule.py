"""The periodic checkpoint schedule alone (legato.session.schedule): by steps, by a rank's clock, and auto's interval
chosen and recorded. A fake clock and a recording stand-in for the Session's telemetry (a fake, for the logic only);
the agreement over real ranks is tests/e2e/test_agreement.py and auto's real runs tests/e2e/test_auto_interval.py."""

from __future__ import annotations

from typing import Any, cast

from legato.config import AUTO, CheckpointSection
from legato.events import Kind
from legato.session.schedule import Schedule
from legato.session.telemetry import Telemetry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Records:
    """Stands in for Telemetry: keeps what is emitted."""

    def __init__(self) -> None:
        self.emitted: list[tuple[Kind, dict[str, Any]]] = []

    def emit(self, kind: Kind, **fields: Any) -> None:
        self.emitted.append((kind, fields))


def schedule(failures: tuple[int, float] = (0, 0.0), **policy: Any) -> tuple[Schedule, Clock, Records]:
    clock, records = Clock(), Records()
    made = Schedule(CheckpointSection(**policy), cast(Telemetry, records), 0, lambda: failures, clock=clock)
    return made, clock, records


def test_every_steps_is_due_on_its_multiples_and_never_when_off() -> None:
    every_3, _, _ = schedule(every_steps=3, every_minutes=0)
    assert [step for step in range(1, 10) if every_3.due_by_steps(step)] == [3, 6, 9]
    off, _, _ = schedule(every_steps=0, every_minutes=0)
    assert not any(off.due_by_steps(step) for step in range(1, 10))


def test_the_clock_votes_after_a_full_interval_since_the_last_save_tried_or_written() -> None:
    every_2_min, clock, _ = schedule(every_minutes=2)
    clock.now += 119.9
    assert not every_2_min.clock_due()
    clock.now += 0.1
    assert every_2_min.clock_due()
    every_2_min.saved()
    assert not every_2_min.clock_due()
    clock.now += 120
    assert every_2_min.clock_due()
    off, clock, _ = schedule(every_minutes=0)
    clock.now += 1e6
    assert not off.clock_due()


def test_auto_chooses_at_its_first_vote_then_from_each_cost_and_records_only_a_move() -> None:
    auto, clock, records = schedule(every_minutes=AUTO)
    assert auto.interval is None
    auto.clock_due()
    assert auto.interval is not None and auto.interval.cost_s is None and auto.interval_s == 600  # unmeasured: 10 minutes
    auto.blocked(6.0)
    measured = auto.interval_s
    assert measured != 600 and auto.interval is not None and auto.interval.cost_s == 6.0
    auto.blocked(6.0)  # the same median: not recorded again
    assert [fields["cost_s"] for kind, fields in records.emitted if kind is Kind.CHECKPOINT_INTERVAL] == [None, 6.0]
    clock.now += measured - 1
    assert not auto.clock_due()
    clock.now += 1
    assert auto.clock_due()


def test_a_fixed_interval_ignores_costs() -> None:
    fixed, _, records = schedule(every_minutes=5)
    fixed.blocked(30.0)
    assert fixed.interval is None and fixed.interval_s == 300 and records.emitted == []
