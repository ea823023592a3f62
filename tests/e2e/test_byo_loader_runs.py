"""Bring your own loader and own state, with real processes: 2 ranks, gloo, real SIGUSR2 (loops in helpers/byo_loops.py).

Each run is stopped twice by a real signal planted through LEGATO_CHAOS_SIGNAL_AT
(the last rank sends it to itself after those steps), relaunched after each
stop, and must end bit for bit where an uninterrupted run ends: every step's
loss bits, every component digest, the parameters. The refusals, in one
process: unit/test_byo_loader.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, codes, manifest, run_ranks, trajectory

LOOPS = ROOT / "tests" / "helpers" / "byo_loops.py"
STEPS = 30


def launch(run_dir: Path, *args: str, **env: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOPS), str(run_dir), *args], **env)


def assert_identical(reference: Path, resumed: Path) -> None:
    assert manifest(resumed, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    for rank in range(2):
        assert trajectory(resumed, rank) == trajectory(reference, rank)
        assert (resumed / f"params_rank{rank}.txt").read_text() == (reference / f"params_rank{rank}.txt").read_text()


@pytest.mark.slow
def test_own_loader_generator_worker_init_accumulation_and_owned_rngs_resume_exactly(tmp_path: Path) -> None:
    """Also: a signal before the loop stops the run at step 0 without a checkpoint (exit 75), and the next launch starts over."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    first = launch(reference, "--loop", "owned")
    assert codes(first) == [0, 0], first[0].stderr[-3000:]
    early = launch(resumed, "--loop", "owned", "--signal-before-loop")
    assert codes(early) == [75, 75], early[0].stderr[-3000:]
    assert "legato: rank 0: stop signal during start-up; stopping at step 0" in early[0].stderr
    assert not list((resumed / "checkpoints").glob("step_*"))
    # Stops after steps 8 (mid-accumulation: 8 % 3 != 0) and 14 (mid-epoch: 12 steps an epoch).
    # Under verify "warn" a stop checkpoint also holds its own state (under "error" only its replay base), so the
    # gradients saved mid-accumulation can be read back below; the resumes still replay and verify.
    attempts = [
        launch(resumed, "--loop", "owned", "--verify", "warn", LEGATO_CHAOS_SIGNAL_AT="7,13", LEGATO_CHAOS_SIGNAL_RANK="1")
        for _ in range(3)
    ]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    grads = torch.load(resumed / "checkpoints" / "step_8" / "rank1.pt", weights_only=True)["grads"]["grads"]
    assert all(g is not None for g in grads)
    assert "resumed at step 8" in attempts[1][0].stderr and "resumed at step 14" in attempts[2][0].stderr
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_iterable_dataset_with_its_own_state_resumes_exactly(tmp_path: Path) -> None:
    """40 samples a rank, 10 steps an epoch of unknown length: stops mid-epoch (step 6) and at an epoch's end (step 20)."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert codes(launch(reference, "--loop", "iterable")) == [0, 0]
    attempts = [launch(resumed, "--loop", "iterable", LEGATO_CHAOS_SIGNAL_AT="5,19", LEGATO_CHAOS_SIGNAL_RANK="1") for _ in range(3)]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    assert [json.loads(line)["epoch"] for line in (resumed / "trajectory" / "rank0.jsonl").read_text().splitlines()][19:21] == [1, 2]
    assert_identical(reference, resumed)


@pytest.mark.slow
def test_zero_redundancy_optimizer_resumes_exactly_from_each_ranks_shard(tmp_path: Path) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert codes(launch(reference, "--loop", "zero")) == [0, 0]
    attempts = [launch(resumed, "--loop", "zero", LEGATO_CHAOS_SIGNAL_AT="9", LEGATO_CHAOS_SIGNAL_RANK="1") for _ in range(2)]
    assert [codes(a) for a in attempts] == [[75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    # The stop checkpoint at 10 holds its state by its replay (its base is step 0's, before Adam has state): the final
    # checkpoint holds each rank's shard.
    final = resumed / "checkpoints" / "step_30"
    shards = [torch.load(final / f"rank{r}.pt", weights_only=True)["optimizer"]["shard"] for r in range(2)]
    assert all(s["state"] for s in shards), "each rank saves the Adam state of the parameters it owns"
    assert "optimizer" not in torch.load(final / "train_state.pt", weights_only=True)
    assert_identical(reference, resumed)
