"""A torchtitan-style optimizer container (its state_dict through torch's get_optimizer_state_dict) is never changed by a capture.

torch's helper initialises an optimizer with no state by running a step (zero gradients, learning rate 0); the
Session's capture at step 0 (the replay base) went through it, and AdamW's step count ended one ahead: the port
differed from its plain loop from step 2 on. Real ranks (gloo) of tests/helpers/titan_loop.py: FSDP2 at 2 and 4 ranks,
DDP at 2; each port, stopped by a real SIGUSR2 right after the step-0 base and resumed (and once uninterrupted), ends
with the plain loop's loss bits at every step and its model and optimizer state bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks

pytestmark = pytest.mark.slow

LOOP = ROOT / "tests" / "helpers" / "titan_loop.py"


def launch(out: Path, wrap: str, world: int, *args: str, **env: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOP), str(out), "--wrap", wrap, *args], world_size=world, timeout=300, **env)


def results(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"result_rank{rank}.json").read_text()) for rank in range(world)]


# The uninterrupted port runs once (FSDP2, 2 ranks), for the suite's time: every stopped run also equals the plain loop
# at every step, through the same step-0 base and checkpoints. DDP at 4 ranks is the plain DDP loop's (test_reduction.py).
@pytest.mark.parametrize(("wrap", "world"), [("fsdp2", 2), ("ddp", 2), ("fsdp2", 4)])
def test_the_port_equals_its_plain_loop_uninterrupted_and_resumed(tmp_path: Path, wrap: str, world: int) -> None:
    plain, uninterrupted, resumed = tmp_path / "plain", tmp_path / "uninterrupted", tmp_path / "resumed"
    assert codes(launch(plain, wrap, world, "--plain")) == [0] * world
    if (wrap, world) == ("fsdp2", 2):
        ran = launch(uninterrupted, wrap, world)
        assert codes(ran) == [0] * world, ran[0].stderr[-3000:]
        assert results(uninterrupted, world) == results(plain, world)
    stop = {"LEGATO_CHAOS_SIGNAL_AT": "2", "LEGATO_CHAOS_SIGNAL_RANK": str(world - 1)}
    assert codes(launch(resumed, wrap, world, **stop)) == [75] * world
    last = launch(resumed, wrap, world)
    assert codes(last) == [0] * world, last[0].stderr[-3000:]
    assert "verified by a replay of 3 steps from step 0" in last[0].stderr, last[0].stderr[-2000:]
    assert results(resumed, world) == results(plain, world)
