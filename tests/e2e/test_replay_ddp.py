"""Replay-verified resume with real processes: 2 ranks, gloo, a real SIGUSR2, user loops on the public API.

Each planted fault (state the loop keeps outside the checkpoint, see
replay_loops.py) used to resume "verified" and diverge silently; the replay
must catch it with the first divergent step, the rank and the cause, and exit
3 on every rank. The same loops with that state registered must replay
identical and end bit for bit where an uninterrupted run ends.

Rank 1 signals itself after step 6; the ranks agree to stop after step 7,
whose checkpoint carries the replay base of step 4 (replay_steps 4).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, codes, run_ranks, run_trainer

pytestmark = pytest.mark.slow

LOOPS = ROOT / "tests" / "helpers" / "replay_loops.py"
STEPS = 12

# "accumulate" is no fault any more: the session saves every .grad (see test_replay.py).
FAULTS = {
    "prefetch": "a prefetched batch",
    "generator": "torch.Generator",
    "worker_rng": "inside DataLoader workers",
}


def launch(run_dir: Path, loop: str, *args: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOPS), str(run_dir), "--loop", loop, "--steps", str(STEPS), *args])


def records(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()]


def global_hash(run_dir: Path, step: int) -> str:
    return json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())["global_hash"]


@pytest.mark.parametrize("loop", sorted(FAULTS))
def test_fault_outside_the_checkpoint_fails_the_resume_with_its_step_and_cause(tmp_path: Path, loop: str) -> None:
    stopped = launch(tmp_path, loop, "--signal-at", "6")
    assert codes(stopped) == [75, 75], stopped[0].stderr[-2000:]
    resumed = launch(tmp_path, loop)
    assert codes(resumed) == [3, 3], resumed[0].stderr[-2000:]
    for proc in resumed:
        assert "replay of steps 5..7 diverged first at step 5 on rank 0" in proc.stderr
        assert FAULTS[loop] in proc.stderr
        assert "Traceback" not in proc.stderr
    assert [r["step"] for r in records(tmp_path, 0)] == list(range(1, 8))


@pytest.mark.parametrize("loop", sorted([*FAULTS, "accumulate"]))
def test_registered_state_replays_identical_and_ends_bitwise_equal(tmp_path: Path, loop: str) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert codes(launch(reference, loop, "--register")) == [0, 0]
    assert codes(launch(resumed, loop, "--register", "--signal-at", "6")) == [75, 75]
    last = launch(resumed, loop, "--register")
    assert codes(last) == [0, 0], last[0].stderr[-2000:]
    assert "resumed at step 7" in last[0].stderr and "verified by a replay of 3 steps from step 4" in last[0].stderr
    assert global_hash(resumed, STEPS) == global_hash(reference, STEPS)
    for rank in range(2):
        assert records(resumed, rank) == records(reference, rank)


def test_a_stop_during_the_replay_writes_no_checkpoint_and_the_next_attempt_replays_again(tmp_path: Path) -> None:
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert codes(launch(reference, "plain")) == [0, 0]
    assert codes(launch(run, "plain", "--signal-at", "6")) == [75, 75]
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    stopped = launch(run, "plain", "--signal-in-replay", "5")
    assert codes(stopped) == [75, 75], stopped[0].stderr[-2000:]
    assert "ranks agreed to stop during the replay, after step 6; the checkpoint at step 7 still stands" in stopped[0].stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    last = launch(run, "plain")
    assert codes(last) == [0, 0] and "verified by a replay of 3 steps from step 4" in last[0].stderr
    assert global_hash(run, STEPS) == global_hash(reference, STEPS)
    for rank in range(2):
        assert records(run, rank) == records(reference, rank)


def test_rng_drawn_after_the_restore_is_caught_by_the_replay_of_the_bundled_trainer(tmp_path: Path) -> None:
    """The digest check passes this fault (the draw comes after it); the replay from step 8 sees step 9 differ."""
    sets = FAST_GPT
    first = run_trainer(TINY_GPT, tmp_path, *sets, "chaos.signal_at_steps=[8]")
    assert first.returncode == 75, first.stderr[-2000:]
    resumed = run_trainer(TINY_GPT, tmp_path, *sets, "chaos.consume_rng_after_restore=[torch]")
    assert resumed.returncode == 3, resumed.stderr[-2000:]
    assert "the replay of steps 9..9 diverged first at step 9 on rank 0" in resumed.stderr
    assert "random numbers were drawn between the restore and the first step" in resumed.stderr
    assert "Differing components" not in resumed.stderr
