"""Goodput of a real run: two stops and a SIGKILL sent from outside, and where each attempt's time went.

2 ranks of the DDP-tutorial loop of hang_loop.py (a checkpoint every 4 steps, 0.1 s steps). The first attempt is
stopped by SIGUSR2 to rank 1, the second killed (SIGKILL to both ranks) between checkpoints, the third stopped by
SIGUSR2 to rank 0, the fourth finishes. `legato status --json` must account for the whole run: the buckets of every
attempt add up to its span and theirs to the run's wall time (from the first launch to the last record), to the
ledger's millisecond rounding; the killed attempt's lost steps are the steps it logged past its last checkpoint, and
its lost seconds those steps at its own step rate; every attempt spent time starting (imports, the process group),
every later one time queued between launches (the test waits before each), and every resume's replay shows; `legato
plot` marks the lost span. The arithmetic on a planted ledger is tests/unit/test_goodput.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.cli import ledger, legato, status, wait_for
from helpers.launches import ROOT, reaped, start_ranks, stderr_tails, steps_done

from legato.orchestrator.goodput import BUCKETS
from legato.orchestrator.plot import lost_spans

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "hang_loop.py"
WAIT_S = 240
ROUNDING_S = 0.01  # every figure is rounded to the millisecond: a sum of ten carries at most this much


def interrupted(run: Path, after: int, sig: signal.Signals, ranks: tuple[int, ...]) -> list[int]:
    with reaped(start_ranks(SCRIPT, run, 2)) as procs:
        wait_for(lambda: steps_done(run) >= after or any(p.poll() is not None for p in procs), timeout=WAIT_S, what=f"step {after}")
        for rank in ranks:
            os.kill(procs[rank].pid, sig)
        return [p.wait(timeout=WAIT_S) for p in procs]


def test_the_buckets_of_a_run_with_two_stops_and_a_kill_add_up_to_its_wall_time(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert interrupted(run, 6, signal.SIGUSR2, (1,)) == [75, 75], stderr_tails(run)
    time.sleep(1)
    # Killed halfway between the checkpoints of steps 16 and 20, so that it throws steps away (the poll sees the 18th
    # line within a step; a kill that still lands on a checkpoint loses nothing, and the ledger then says so).
    assert interrupted(run, 18, signal.SIGKILL, (0, 1)) == [-signal.SIGKILL] * 2
    logged = [json.loads(line)["step"] for line in (run / "trajectory" / "rank0.jsonl").read_text().splitlines()]
    newest = max(int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*"))
    time.sleep(1)
    assert interrupted(run, 26, signal.SIGUSR2, (0,)) == [75, 75], stderr_tails(run)
    time.sleep(1)
    with reaped(start_ranks(SCRIPT, run, 2)) as procs:
        assert [p.wait(timeout=WAIT_S) for p in procs] == [0, 0], stderr_tails(run)

    summary = status(run)
    attempts, total = summary["attempts"], summary["spent"]
    assert len(attempts) == 4 and [a["lost_steps"] for a in attempts] == [0, logged[-1] - newest, 0, 0], attempts
    for a in attempts:
        spent = a["spent"]
        assert abs(sum(spent[b] for b in BUCKETS) - spent["wall_s"]) <= ROUNDING_S, spent
        assert spent["starting"] > 0 and (spent["training"] > 0 or not a["steps_run"]), a  # a kill may come in the replay
    # The test waited a second between launches; a process's start is known to a clock tick (10 ms). The killed
    # attempt's end is its estimate (its lost steps at its mean step time, which a loaded machine's uneven steps can
    # put past the kill, though never past the next launch): the line between its lost time and the next attempt's
    # queue is that estimate's.
    queued = [a["spent"]["queued"] for a in attempts]
    assert queued[1] >= 0.98 and queued[2] + attempts[1]["spent"]["lost"] >= 0.98 and queued[3] >= 0.98, queued
    assert all(a["spent"]["replay"] > 0 for a in attempts[1:]), [a["spent"] for a in attempts]
    # The killed attempt's lost seconds: its lost steps at its step rate (its replay's when it trained none past it).
    killed, lost_steps = attempts[1], logged[-1] - newest
    rate_s = (
        killed["spent"]["training"] / killed["steps_run"]
        if killed["steps_run"]
        else killed["replay"]["seconds"] / killed["replay"]["steps"]
    )
    records = ledger(run)
    launches = [e["launched_at"] for e in records if e["event"] == "attempt_started"]
    killed_last = max(e["time"] for e in records if e.get("restart") == killed["restart"] and str(e.get("job_id")) == str(killed["job_id"]))
    estimate = min(rate_s * lost_steps, launches[2] - killed_last)  # the next launch bounds it
    assert abs(killed["spent"]["lost"] - estimate) <= ROUNDING_S and (killed["spent"]["lost"] > 0) == (lost_steps > 0), killed
    assert abs(total["wall_s"] - sum(a["spent"]["wall_s"] for a in attempts)) <= ROUNDING_S

    first_launch, last = launches[0], max(e["time"] for e in records)
    # The killed attempt ended, by the estimate, its lost steps after its last record: the run's wall time is the span
    # from the first launch to the last record, give or take the rounding.
    assert abs(total["wall_s"] - (last - first_launch)) <= ROUNDING_S, (total, last - first_launch)
    assert 0 < total["goodput"] < 1
    assert "goodput " in legato("status", str(run)).stdout

    # `legato plot` marks the span the kill threw away.
    assert lost_spans(records) == ([(newest, logged[-1])] if lost_steps else [])
    plotted = legato("plot", str(run))
    assert plotted.returncode == 0 and (run / "loss.png").read_bytes()[:4] == b"\x89PNG", plotted.stderr
