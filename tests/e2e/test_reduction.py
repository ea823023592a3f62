"""Reduction order at 3+ ranks: a resumed attempt sums gradients exactly like the uninterrupted run.

Real gloo process groups of real processes. The reducer-level test shows the
fault is real (DDP's own per-attempt layout parts the runs at the first
resumed step) and that restoring the run's layout removes it; the end-to-end
tests run 4 ranks through `legato verify` and 8 ranks through the trainer,
across two interruptions, and plant the layout fault for the checker to name.
A run under legato is bitwise the plain DDP loop (helpers/plain_vs_legato.py,
several buckets) at 2, 3, 4 and 8 ranks, uninterrupted and resumed, eager and
under torch.compile.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST_GPT, NEEDS_CXX, ROOT, TINY_GPT, assert_bitwise_equal, manifest, run_ranks, run_trainer
from helpers import warm
from helpers.shared_runs import SharedRuns, run_key
from test_verify import verify

from legato.runtime.launch import free_port

pytestmark = pytest.mark.slow

SMALL = ("train.steps=8", "train.num_workers=0", "repro.enabled=false")


def reducer_experiment(tmp_path: Path, world: int) -> dict:
    out, port = tmp_path / "result.json", str(free_port())
    cmd = [sys.executable, str(ROOT / "tests" / "helpers" / "ddp_attempts.py")]
    # stderr to files read after the wait, never pipes: a rank whose pipe fills blocks, and its peers with it.
    logs = [tmp_path / f"rank{rank}.stderr" for rank in range(world)]
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONWARNINGS="ignore")  # as every rank the suite starts warm
    procs = [warm.start([*cmd, str(rank), str(world), port, str(out)], env, stderr=logs[rank].open("w")) for rank in range(world)]
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log.read_text()[-2000:] for log in logs)
    return json.loads(out.read_text())


@pytest.mark.parametrize("world", [3, 4])
def test_fresh_ddp_attempt_reduces_like_the_uninterrupted_run_only_with_its_layout_restored(tmp_path: Path, world: int) -> None:
    result = reducer_experiment(tmp_path, world)
    restored, default = result["restored"], result["ddp_default"]
    assert restored["resumed"] == restored["uninterrupted"]
    # DDP's own layout: the first resumed step already differs (the planted fault is real at this size).
    assert default["resumed"][0] != default["uninterrupted"][0]


def test_four_ranks_verify_bitwise_across_two_interruptions(tmp_path: Path) -> None:
    code, verdict, out = verify(tmp_path, "--interrupt-at", "2,5", sets=("local.tasks=4", *SMALL))
    assert code == 0, out[-3000:]
    assert verdict["identical"] and verdict["world_size"] == 4
    assert [r["step"] for r in verdict["resumes"]] == [3, 6] and all(r["match"] for r in verdict["resumes"])
    assert verdict["reference_final_hash"] == verdict["run_final_hash"] and not verdict["unpinned_layouts"]


def test_eight_ranks_resume_bitwise_across_two_interruptions(tmp_path: Path) -> None:
    sets = (*FAST_GPT, "train.steps=6", "train.num_workers=0", "checkpoint.hash_every_steps=1")
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    proc = run_trainer(TINY_GPT, reference, *sets, nproc=8, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = []
    for _ in range(3):
        proc = run_trainer(TINY_GPT, resumed, *sets, "chaos.signal_rank=5", "chaos.signal_at_steps=[1,3]", nproc=8, timeout=600)
        codes.append(proc.returncode)
        if proc.returncode != 75:
            break
    assert codes == [75, 75, 0], proc.stderr[-3000:]
    assert_bitwise_equal(reference, resumed, 6, world_size=8)


def test_planted_layout_fault_is_caught_and_named_reduction_order(tmp_path: Path) -> None:
    # Replay off: this is the restore check's diagnosis (the layout is state: its digest differs on every rank).
    code, verdict, out = verify(
        tmp_path, "--interrupt-at", "2", sets=("local.tasks=4", "chaos.skip_restore=[buckets]", "checkpoint.replay_steps=0", *SMALL)
    )
    assert code == 1, out[-3000:]
    assert not verdict["identical"] and not verdict["resumes"][0]["match"]
    assert set(verdict["resumes"][0]["mismatches"]) == {"0", "1", "2", "3"}
    assert all(names == ["buckets"] for names in verdict["resumes"][0]["mismatches"].values())
    assert "reduction order" in verdict["cause"] and "bucket layout was not restored" in verdict["cause"], verdict["cause"]
    assert [u["run"] for u in verdict["unpinned_layouts"]] == ["run"]


PLAIN_VS_LEGATO = ROOT / "tests" / "helpers" / "plain_vs_legato.py"
STOPS = {"LEGATO_CHAOS_SIGNAL_AT": "2,5", "LEGATO_CHAOS_SIGNAL_RANK": "1"}


def digests(out: Path) -> dict[int, str]:
    """Rank 0's parameter digest after each step; a step run twice (a replay) must have the same bits both times."""
    seen: dict[int, str] = {}
    for line in (out / "digests.txt").read_text().splitlines():
        step, digest = line.split()
        assert seen.setdefault(int(step), digest) == digest, f"step {step} ran twice with different bits"
    return seen


def launch_loop(out: Path, world: int, *args: str, **env: str) -> list[int]:
    procs = run_ranks([sys.executable, str(PLAIN_VS_LEGATO), str(out), *args], world_size=world, timeout=600, **env)
    failed = [f"rank {rank} exited {p.returncode}:\n{p.stderr[-3000:]}" for rank, p in enumerate(procs) if p.returncode not in (0, 75)]
    assert not failed, "\n".join(failed)
    return [p.returncode for p in procs]


def plain_digests(shared_runs: SharedRuns, world: int, *args: str) -> dict[int, str]:
    """The plain loop's digests at `world` ranks with `args`: one run per suite, whichever test asks first."""

    def build(out: Path) -> None:
        assert launch_loop(out, world, *args) == [0] * world

    return digests(shared_runs.get(run_key("plain_vs_legato", str(world), *args), build))


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_uninterrupted_legato_run_is_bitwise_the_plain_ddp_loop(shared_runs: SharedRuns, tmp_path: Path, world: int) -> None:
    plain = plain_digests(shared_runs, world)
    assert launch_loop(tmp_path / "legato", world, "--legato") == [0] * world
    assert digests(tmp_path / "legato") == plain and len(plain) == 8
    buckets = torch.load(tmp_path / "legato" / "checkpoints" / "step_8" / "train_state.pt", weights_only=True)["buckets"]["buckets"]
    assert len(buckets) >= 3, buckets  # several gradient buckets, in DDP's own gradient-ready order


@pytest.mark.parametrize("replay", ["0", "2"])
def test_four_ranks_multi_bucket_resumed_twice_is_bitwise_the_plain_ddp_loop(shared_runs: SharedRuns, tmp_path: Path, replay: str) -> None:
    """Replay off: the restored layout alone; replay 2: the replay base's layout (the run's, two steps back)."""
    codes = [launch_loop(tmp_path / "resumed", 4, "--legato", "--replay-steps", replay, **STOPS)[0] for _ in range(3)]
    assert codes == [75, 75, 0]
    assert digests(tmp_path / "resumed") == plain_digests(shared_runs, 4)


@NEEDS_CXX
@pytest.mark.parametrize("compiled", ["inner", "outer"])
def test_a_compiled_ddp_model_resumed_twice_is_bitwise_the_plain_compiled_loop(tmp_path: Path, compiled: str) -> None:
    """torch.compile inside DDP (nanoGPT's order) and around it (torch's recommended order), 3 ranks, with a replay.

    Around it, legato looks through torch.compile's wrapper for DDP's layout: before it did, a resume failed its replay
    here, and with 4 ranks and no replay the resumed run parted from the plain one while every resume verified."""
    assert launch_loop(tmp_path / "plain", 3, "--compile", compiled) == [0] * 3
    codes = [launch_loop(tmp_path / "resumed", 3, "--compile", compiled, "--legato", "--replay-steps", "2", **STOPS)[0] for _ in range(3)]
    assert codes == [75, 75, 0]
    assert digests(tmp_path / "resumed") == digests(tmp_path / "plain")
    buckets = torch.load(tmp_path / "resumed" / "checkpoints" / "step_8" / "train_state.pt", weights_only=True)["buckets"]["buckets"]
    assert len(buckets) >= 3, buckets
    assert manifest(tmp_path / "resumed", 8)["model_compiled"] is True


def test_a_resume_that_leaves_ddp_its_own_layout_fails_naming_the_buckets(tmp_path: Path) -> None:
    assert launch_loop(tmp_path, 4, "--legato", "--skip-buckets", **STOPS) == [75] * 4
    procs = run_ranks([sys.executable, str(PLAIN_VS_LEGATO), str(tmp_path), "--legato", "--skip-buckets"], world_size=4, timeout=600)
    # Every rank refuses with exit 3; rank 0 says why, once, for all of them.
    assert [proc.returncode for proc in procs] == [3] * 4, procs[0].stderr[-3000:]
    assert "Resume verification failed at step 3" in procs[0].stderr, procs[0].stderr[-3000:]
    assert "Differing components: rank 0: buckets; rank 1: buckets; rank 2: buckets; rank 3: buckets" in procs[0].stderr
