"""`checkpoint.every_minutes: auto`: the periodic interval chosen by Young-Daly from the run's own evidence, recorded.

2 real ranks of the DDP-tutorial loop of hang_loop.py with `every_minutes="auto"` (and a checkpoint every 4 steps, so
that a periodic checkpoint is measured within seconds). The first attempt records the interval it starts with (10
minutes until a checkpoint is measured, no failure seen) and, after its first periodic checkpoint, the one Young-Daly
gives from that checkpoint's cost and the prior of one failure a day. Both ranks are then SIGKILLed from outside
between checkpoints; the next launch records the kill (`work_lost`), and the interval it chooses after its first
periodic checkpoint counts that failure: the expected time between failures halves. The run ends on the bits of the
uninterrupted run, and `legato watch`'s words for each record say the same. The arithmetic, the bounds and the
refusals are in tests/unit/test_checkpoint_spacing.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from helpers.cli import ledger, wait_for
from helpers.launches import ROOT, reaped, start_ranks, stderr_tails, steps_done

from legato.events import interval_label
from legato.session import spacing

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "hang_loop.py"
AUTO = {"EVERY_MINUTES": "auto", "STEPS": "24"}
WAIT_S = 240


def launch(run: Path, **env: str) -> list[int]:
    with reaped(start_ranks(SCRIPT, run, 2, **AUTO, **env)) as procs:
        return [p.wait(timeout=WAIT_S) for p in procs]


def intervals(run: Path) -> list[dict]:
    return [e for e in ledger(run) if e["event"] == "checkpoint_interval"]


def final_hash(run: Path) -> str:
    (finished,) = [e for e in ledger(run) if e["event"] == "finished"]
    return finished["final_global_hash"]


def test_auto_spacing_is_chosen_from_the_measured_cost_and_a_kill_the_ledger_records(tmp_path: Path) -> None:
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert launch(reference) == [0, 0], stderr_tails(reference)

    with reaped(start_ranks(SCRIPT, run, 2, **AUTO)) as procs:
        wait_for(lambda: steps_done(run) >= 10, timeout=WAIT_S, what="rank 0's tenth step")
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        assert [p.wait(timeout=60) for p in procs] == [-signal.SIGKILL] * 2
    first = intervals(run)
    assert [(e["minutes"], e["cost_s"], e["failures"]) for e in first[:1]] == [(spacing.UNMEASURED_MINUTES, None, 0)], first
    measured = first[1]
    assert measured["cost_s"] > 0 and measured["failures"] == 0 and measured["mtbf_hours"] >= spacing.PRIOR_MTBF_H, measured
    assert spacing.MIN_MINUTES <= measured["minutes"] <= spacing.MAX_MINUTES

    assert launch(run) == [0, 0], stderr_tails(run)
    assert [e["event"] for e in ledger(run)].count("work_lost") == 1
    second = [e for e in intervals(run) if e["restart"] != first[0]["restart"]]
    learned = next(e for e in second if e["cost_s"] is not None)
    # One failure: the prior day and the run's few seconds shared by two observations.
    assert learned["failures"] == 1 and learned["mtbf_hours"] < measured["mtbf_hours"] / 2 + 0.01, (measured, learned)
    assert final_hash(run) == final_hash(reference)
    assert "one failure every" in interval_label(learned) and "1 seen" in interval_label(learned)
