"""Replay bases spaced by their cost, agreed by real ranks, and the resume from such a base bitwise.

2 real ranks (gloo) run the plain loop of replay_loops.py with a 192 MiB frozen parameter (the state is large, the
compute small) at the default cost bound (`replay_cost` 0.02) and steps slowed to about 30 ms: a base's copy costs far
more than 2% of 32 such steps, so bases come less often than every 32 steps, by a spacing each rank works out from its
own copy and step times. A real SIGUSR2 sent from outside, by pid, to rank 1 stops the run. Every checkpoint's ranks
name the same base (the ranks agreed the spacing, the largest of theirs: kept on each rank's own they split, the
planted fault of tests/unit/test_base_clock.py), the resume replays from it, verifies, and ends on the uninterrupted
run's final hash. The copies' count against the state size is in tests/unit/test_proof_cost.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks
from helpers import warm
from helpers.cli import wait_for
from helpers.launches import reaped, steps_done

from legato.runtime.launch import free_port
from legato.voice import counted

pytestmark = pytest.mark.slow

LOOPS = ROOT / "tests" / "helpers" / "replay_loops.py"
STEPS = 160
ARGS = ("--steps", str(STEPS), "--replay-steps", "32", "--replay-cost", "0.02", "--ballast-mb", "192", "--step-sleep", "0.03")


def command(run_dir: Path) -> list[str]:
    return [sys.executable, str(LOOPS), str(run_dir), "--loop", "plain", *ARGS]


def manifests(run_dir: Path) -> dict[int, dict]:
    return {
        int(p.name.removeprefix("step_")): json.loads((p / "manifest.json").read_text()) for p in (run_dir / "checkpoints").glob("step_*")
    }


def test_bases_spaced_by_their_cost_are_agreed_and_the_resume_from_one_is_bitwise(tmp_path: Path) -> None:
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert codes(run_ranks(command(reference))) == [0, 0]

    port = free_port()
    env = dict(os.environ, PYTHONHASHSEED="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONWARNINGS="ignore")
    with reaped([]) as procs:
        for rank in range(2):
            procs.append(warm.start(command(run), {**env, "RANK": str(rank)}))
        wait_for(lambda: steps_done(run) >= 80 or any(p.poll() is not None for p in procs), timeout=300, what="80 steps")
        assert all(p.poll() is None for p in procs), "a rank ended before the stop"
        procs[1].send_signal(signal.SIGUSR2)
        assert [p.wait(timeout=300) for p in procs] == [75, 75]

    stop = max(manifests(run))
    manifest = manifests(run)[stop]
    assert manifest["reason"] == "signal" and 80 <= stop < STEPS
    assert {r["from_step"] for r in manifest["replay"]["ranks"]} == {manifest["replay"]["from_step"]}
    base = manifest["replay"]["from_step"]
    assert base % 32 == 0 and base < stop

    last = run_ranks(command(run))
    assert codes(last) == [0, 0], last[0].stderr[-3000:]
    assert f"verified by a replay of {counted(stop - base, 'step')} from step {base}" in last[0].stderr
    assert manifests(run)[STEPS]["global_hash"] == manifests(reference)[STEPS]["global_hash"]
