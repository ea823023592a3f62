"""Users' loaders with 2 real ranks, gloo and real SIGUSR2 (loops in helpers/loader_loops.py): torchdata's
StatefulDataLoader resumes bitwise with 0 and 2 workers, mid-epoch and at an epoch's end; adopting legato leaves the
batch order of a `cycle(dl)` loop and of an epoch loop untouched; `enumerate(session.batches(), start=session.step_in_epoch)`
keeps the loop's numbering across a resume; k micro-batches per optimizer step from an endless loader resume bitwise.

Each resumed run is stopped by signals planted through LEGATO_CHAOS_SIGNAL_AT (the last rank sends SIGUSR2 to itself
after those steps; the ranks agree to stop one step later), relaunched after each stop, and must end where the
uninterrupted run ends: every batch's sha256, the loop's own index, every step's loss bits, the parameters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks, trajectory

LOOPS = ROOT / "tests" / "helpers" / "loader_loops.py"


def launch(run_dir: Path, *args: str, **env: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOPS), str(run_dir), *args], timeout=300, **env)


def batches(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / f"batches_rank{rank}.jsonl").read_text().splitlines()]


def params(run_dir: Path, rank: int) -> str:
    return (run_dir / f"params_rank{rank}.txt").read_text()


def resume_twice(run_dir: Path, signal_at: str, *args: str) -> list[list[subprocess.CompletedProcess]]:
    attempts = [launch(run_dir, *args, LEGATO_CHAOS_SIGNAL_AT=signal_at, LEGATO_CHAOS_SIGNAL_RANK="1") for _ in range(3)]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    return attempts


def assert_same_run(reference: Path, resumed: Path, legato_both: bool = True) -> None:
    for rank in range(2):
        assert batches(resumed, rank) == batches(reference, rank)
        assert params(resumed, rank) == params(reference, rank)
        if legato_both:
            assert [r["loss_hex"] for r in trajectory(resumed, rank)] == [r["loss_hex"] for r in trajectory(reference, rank)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loop", "workers", "signal_at", "resumed_at"),
    [
        ("stateful-map", 0, "5,11", (6, 12)),  # 12 batches an epoch: mid-epoch, then at the end of epoch 0
        ("stateful-map", 2, "16,23", (17, 24)),  # mid-epoch 1, then at the end of epoch 1
        ("stateful-iterable", 2, "4,9", (5, 10)),  # 10 batches an epoch (len(loader)), 5 from each worker
    ],
)
def test_stateful_dataloader_resumes_bitwise(tmp_path: Path, loop: str, workers: int, signal_at: str, resumed_at: tuple) -> None:
    """total_epochs= with len(loader); augmentation from the global RNGs in the map-style dataset (per-sample seeded in
    the workers); the iterable one split over the workers, its position saved by the loader's own snapshots."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    args = ("--loop", loop, "--workers", str(workers))
    assert codes(first := launch(reference, *args)) == [0, 0], first[0].stderr[-3000:]
    attempts = resume_twice(resumed, signal_at, *args)
    for attempt, step in zip(attempts[1:], resumed_at):
        assert f"resumed at step {step} " in attempt[0].stderr and "verified" in attempt[0].stderr
    assert_same_run(reference, resumed)
    assert len(batches(reference, 0)) == (36 if loop == "stateful-map" else 30)


@pytest.mark.slow
def test_a_cycle_loop_keeps_its_order_with_legato_and_its_micro_batches_resume_bitwise(tmp_path: Path) -> None:
    """The plain loop draws 2 batches per optimizer step from `cycle(dl)`, never calling set_epoch: every pass over the
    loader repeats epoch 0's order. legato's loop (one session step per micro-batch) sees the same batches past epoch 2
    and trains to the same parameters; stopped mid-accumulation and mid-epoch, it resumes bitwise."""
    plain, reference, resumed = tmp_path / "plain", tmp_path / "reference", tmp_path / "resumed"
    assert codes(first := launch(plain, "--loop", "cycle", "--plain")) == [0, 0], first[0].stderr[-3000:]
    assert codes(first := launch(reference, "--loop", "cycle")) == [0, 0], first[0].stderr[-3000:]
    assert_same_run(plain, reference, legato_both=False)
    seen = batches(reference, 0)
    assert len(seen) == 20 and [b["samples"] for b in seen[12:18]] == [b["samples"] for b in seen[:6]], "epoch 2 repeats epoch 0"
    resume_twice(resumed, "6,14", "--loop", "cycle")  # stops after micro-batches 7 and 15: mid-accumulation, mid-epoch 1 and 2
    assert_same_run(reference, resumed)


@pytest.mark.slow
def test_an_epoch_loop_keeps_its_order_and_its_enumerate_index_across_resumes(tmp_path: Path) -> None:
    """The loop calls sampler.set_epoch(epoch) itself, as the plain loop does; `enumerate(session.batches(),
    start=session.step_in_epoch)` numbers a resumed epoch's batches as the uninterrupted run did."""
    plain, reference, resumed = tmp_path / "plain", tmp_path / "reference", tmp_path / "resumed"
    assert codes(first := launch(plain, "--loop", "epochs", "--plain")) == [0, 0], first[0].stderr[-3000:]
    assert codes(first := launch(reference, "--loop", "epochs")) == [0, 0], first[0].stderr[-3000:]
    assert_same_run(plain, reference, legato_both=False)
    assert [b["index"] for b in batches(reference, 0)] == list(range(6)) * 3
    resume_twice(resumed, "2,8", "--loop", "epochs")  # mid-epoch 0 (step 3), mid-epoch 1 (step 9)
    assert_same_run(reference, resumed)
