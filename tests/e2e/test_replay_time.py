"""The replay bounded by time: slow steps take new replay bases by the clock, agreed by real ranks, and the resume is bitwise.

2 real ranks (gloo) run the plain loop of replay_loops.py with every step slowed by chaos (0.15 s) and a replay bound of
0.6 s against replay_steps 32, so new bases come every few steps by the clock, never by the step count. A real SIGUSR2
sent from outside, by pid, to rank 1 alone stops the run at an agreed step N. Every checkpoint's ranks name the same
base step (the agreement, not each rank's own clock, decided it); the resume replays N - B steps, far fewer than 32,
verifies, and ends bit for bit where an uninterrupted run ends; `legato status` shows the replay's steps and seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks
from helpers import warm
from helpers.cli import legato, status, wait_for
from helpers.launches import reaped, steps_done

from legato.runtime.launch import free_port
from legato.voice import counted

pytestmark = pytest.mark.slow

LOOPS = ROOT / "tests" / "helpers" / "replay_loops.py"
STEPS, REPLAY_STEPS, EVERY_STEPS = 40, 32, 8
BOUNDED = (
    "--steps",
    str(STEPS),
    "--replay-steps",
    str(REPLAY_STEPS),
    "--replay-seconds",
    "0.6",
    "--every-steps",
    str(EVERY_STEPS),
    "--keep-last",
    "10",
)


def command(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, str(LOOPS), str(run_dir), "--loop", "plain", *BOUNDED, *args]


def manifests(run_dir: Path) -> dict[int, dict]:
    found = {}
    for path in (run_dir / "checkpoints").glob("step_*"):
        found[int(path.name.removeprefix("step_"))] = json.loads((path / "manifest.json").read_text())
    return found


def records(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()]


def stop_from_outside(run_dir: Path, after: int) -> list[str]:
    """Both ranks with slowed steps; once rank 0 logged `after` steps, SIGUSR2 to rank 1's pid. Returns each rank's log."""
    port = free_port()
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile(mode="w+")) for _ in range(2)]
        with reaped([]) as procs:
            for rank in range(2):
                env = dict(
                    os.environ,
                    PYTHONHASHSEED="0",
                    RANK=str(rank),
                    WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    PYTHONWARNINGS="ignore",
                )
                procs.append(warm.start(command(run_dir, "--step-sleep", "0.15"), env, stderr=logs[rank]))
            wait_for(lambda: steps_done(run_dir) >= after or any(p.poll() is not None for p in procs), timeout=180, what="steps")
            assert all(p.poll() is None for p in procs), "a rank ended before the stop"
            procs[1].send_signal(signal.SIGUSR2)
            assert [p.wait(timeout=180) for p in procs] == [75, 75]
        texts = []
        for log in logs:
            log.seek(0)
            texts.append(log.read())
        return texts


def test_slow_steps_bound_the_replay_by_time_agreed_on_every_rank_and_the_resume_is_bitwise(tmp_path: Path) -> None:
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert codes(run_ranks(command(reference))) == [0, 0]
    stop_from_outside(run, after=20)

    found = manifests(run)
    stop = max(found)
    assert stop < REPLAY_STEPS and found[stop]["reason"] == "signal", sorted(found)
    for step, manifest in found.items():
        base_steps = {rank["from_step"] for rank in manifest["replay"]["ranks"]}
        assert base_steps == {manifest["replay"]["from_step"]}, (step, base_steps)
    base = found[stop]["replay"]["from_step"]
    # Before step 32 the steps bound alone keeps the base of step 0: a later one was taken by the clock.
    assert 0 < base < stop and stop - base < REPLAY_STEPS

    last = run_ranks(command(run))
    assert codes(last) == [0, 0], last[0].stderr[-3000:]
    assert f"resumed at step {stop}" in last[0].stderr
    assert f"verified by a replay of {counted(stop - base, 'step')} from step {base}" in last[0].stderr
    assert manifests(run)[STEPS]["global_hash"] == manifests(reference)[STEPS]["global_hash"]
    for rank in range(2):
        assert records(run, rank) == records(reference, rank)

    resumed = status(run)["attempts"][-1]
    assert resumed["replay"]["steps"] == stop - base and resumed["replay"]["identical"]
    assert resumed["replay"]["seconds"] > 0 and resumed["resume_seconds"] >= resumed["replay"]["seconds"]
    table = legato("status", str(run))
    assert table.returncode == 0 and f"replay ✓ {counted(stop - base, 'step')} in " in table.stdout, table.stdout
