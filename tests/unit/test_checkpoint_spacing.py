"""`every_minutes: auto` on its own: Young-Daly's arithmetic, the prior, the bounds, which records count as failures,
when a new interval is recorded, and the setting's spelling and refusal. The real run (ranks killed from outside, the
interval chosen again from the kill the ledger records) is tests/e2e/test_auto_interval.py."""

from __future__ import annotations

import math

import pytest

import legato
from legato.config import config_from_dict
from legato.errors import UsageError
from legato.events import interval_label
from legato.session import spacing
from legato.session.base_clock import WITHOUT_INTERVAL_S, bound_seconds

DAY_S = 86_400.0


def test_young_daly_from_the_cost_and_the_prior_alone() -> None:
    chosen = spacing.choose(2.6, failures=0, run_s=0.0)
    assert chosen.mtbf_hours == spacing.PRIOR_MTBF_H
    assert chosen.young_daly_minutes == round(math.sqrt(2 * 2.6 * DAY_S) / 60, 3) == chosen.minutes  # about 11 minutes


def test_each_failure_moves_the_estimate_and_the_interval_shrinks() -> None:
    calm, failing = spacing.choose(2.6, 0, 6 * 3600.0), spacing.choose(2.6, 3, 6 * 3600.0)
    assert failing.mtbf_hours == round((6 + 24) / 4, 3) and calm.mtbf_hours == 30.0
    assert failing.minutes < calm.minutes


def test_the_interval_stays_within_its_bounds_and_says_when_it_was_bounded() -> None:
    cheap, dear = spacing.choose(0.001, 0, 0.0), spacing.choose(10_000.0, 0, 0.0)
    assert cheap.minutes == spacing.MIN_MINUTES and cheap.young_daly_minutes is not None and cheap.young_daly_minutes < cheap.minutes
    assert dear.minutes == spacing.MAX_MINUTES
    assert "bounded from" in interval_label(vars(cheap)) and "bounded" not in interval_label(vars(spacing.choose(2.6, 0, 0.0)))


def test_before_a_measured_cost_the_interval_is_the_default() -> None:
    first = spacing.choose(None, 2, 3600.0)
    assert (first.minutes, first.cost_s, first.young_daly_minutes) == (spacing.UNMEASURED_MINUTES, None, None)
    assert "until one is measured" in interval_label(vars(first))


def test_only_unannounced_interruptions_count_and_the_run_starts_at_its_first_record() -> None:
    records = [
        {"event": "run_started", "time": 1000.0},
        {"event": "stop_signal", "time": 1100.0},  # announced: loses nothing
        {"event": "attempt_stopped", "time": 1101.0},
        {"event": "work_lost", "time": 1200.0},
        {"event": "hang", "time": 1300.0},
        {"event": "rank_lost", "time": 1400.0},
        {"event": "finished"},  # no time: not the run's start
    ]
    assert spacing.failures_since_start(records, now=4600.0) == (3, 3600.0)
    assert spacing.failures_since_start([], now=5.0) == (0, 0.0)


def test_a_new_interval_is_recorded_first_once_measured_and_when_it_moves() -> None:
    unmeasured, measured = spacing.choose(None, 0, 0.0), spacing.choose(2.6, 0, 0.0)
    assert spacing.worth_recording(unmeasured, None)
    assert not spacing.worth_recording(spacing.choose(None, 1, 0.0), unmeasured)
    assert spacing.worth_recording(measured, unmeasured)
    assert not spacing.worth_recording(spacing.choose(2.7, 0, 0.0), measured)  # within 20%
    assert spacing.worth_recording(spacing.choose(2.6, 3, 0.0), measured)  # half the time between failures


def test_auto_is_a_setting_of_both_doors_and_anything_else_is_refused_in_one_paragraph() -> None:
    assert config_from_dict({"checkpoint": {"every_minutes": "auto"}}).checkpoint.every_minutes == "auto"
    assert legato.CheckpointPolicy(every_minutes="auto").every_minutes == "auto"
    assert bound_seconds(None, "auto") == WITHOUT_INTERVAL_S
    with pytest.raises(UsageError) as refused:
        config_from_dict({"checkpoint": {"every_minutes": "soon"}})
    assert "or auto" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UsageError):
        legato.CheckpointPolicy(every_minutes="Auto")
