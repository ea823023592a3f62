"""FSDP2 (fully_shard) under the same proof as DDP: real ranks (gloo, CPU), real signals, bitwise comparisons.

- the shard records themselves (helpers/fsdp2_shards.py): a round trip restores every local shard and the
  optimizer bit for bit, another rank's shard and an unregistered DTensor are refused;
- the bundled trainer on configs/tiny_gpt_fsdp2.yaml (bfloat16 parameters, float32 reduction, no resharding
  after forward, 2 micro-batches with the gradient sync off for the first, activation checkpointing) through
  `legato verify` at 2 and 4 ranks, two interruptions each;
- planted faults (the interrupted run's periodic checkpoints written in the background): one shard's bytes
  changed on disk (the checkpoint is skipped, naming the file, and the run ends bitwise where the uninterrupted
  one does) and an unrestored sharded optimizer (the restore check names it on every rank);
- a torchtitan-style loop (examples/port/fsdp2_*.py) ported in at most 10 lines: an uninterrupted port is the
  plain loop bit for bit, and a port stopped twice by SIGUSR2 sent from here to a rank's pid ends on the same bits;
  the same loop with its blocks compiled (torch.compile) stopped twice ends on the uninterrupted compiled run's bits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FAST_GPT, NEEDS_CXX, ROOT, codes, manifest, run_ranks, run_trainer, trajectory
from helpers.cli import legato, wait_for
from helpers.launches import catches_usr2, reaped, start_ranks, stderr_tails
from helpers.port import PORT, UNSEEDED, launch, plain_finished, result
from test_port import changed_lines

pytestmark = pytest.mark.slow

FSDP2_GPT = ROOT / "configs" / "tiny_gpt_fsdp2.yaml"
SHARDS = ROOT / "tests" / "helpers" / "fsdp2_shards.py"
SHORT = (*FAST_GPT, "train.steps=16", "train.num_workers=0")


@pytest.mark.parametrize("world", [2, 4])
def test_shard_records_restore_bitwise_and_refuse_another_ranks_shard(tmp_path: Path, world: int) -> None:
    procs = run_ranks([sys.executable, str(SHARDS), str(tmp_path)], world_size=world, PYTHONPATH=str(ROOT / "tests"))
    assert codes(procs) == [0] * world, procs[0].stderr[-3000:]
    for rank in range(world):
        seen = json.loads((tmp_path / f"result_rank{rank}.json").read_text())
        assert seen["digest_survives_save"] and seen["model_restored"] and seen["grads_restored"] and seen["next_step_identical"]
        assert "the checkpoint was sharded otherwise" in seen["foreign_shard"]
        assert "holds a DTensor" in seen["unregistered"] and "model=" in seen["unregistered"]
        assert "not yet reduced (0.weight, 0.bias, 2.weight" in seen["unreduced"] and seen["reduced_saves"]
    # 7 rows over the ranks: the last rank's shard is short (FSDP2 pads it), and saved without the padding.
    assert json.loads((tmp_path / f"result_rank{world - 1}.json").read_text())["uneven_local_shapes"][0][0] < 7 // world + 1


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_config_verifies_bitwise_across_two_interruptions(tmp_path: Path, world: int) -> None:
    args = ["verify", str(FSDP2_GPT), "--interrupt-at", "5,10", "--out", str(tmp_path / "verify"), "--json"]
    for item in (*SHORT, f"local.tasks={world}"):
        args += ["--set", item]
    proc = legato(*args, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    verdict = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert verdict["identical"] and verdict["reference_final_hash"] == verdict["run_final_hash"]
    assert [r["step"] for r in verdict["resumes"]] == [6, 11]
    runs = [p for p in (tmp_path / "verify").iterdir() if (p / "checkpoints").is_dir()]
    for run in runs:
        final = manifest(run, 16)
        # Each rank's own shards, each file hashed in the manifest, each rank's digests under the global hash.
        for rank in range(world):
            for name in ("model", "optimizer"):
                assert f"{name}.shard{rank}.pt" in final["files"]
            assert {"model", "optimizer", "grads"} <= set(final["ranks"][rank]["components"])
        assert "model.pt" not in final["files"]


def shard_bits(run: Path, name: str, rank: int, step: int = 12) -> str:
    """A shard file's content with every tensor spelled as its bytes: equal strings are equal bits."""
    state = torch.load(run / "checkpoints" / f"step_{step}" / f"{name}.shard{rank}.pt", weights_only=True)
    return json.dumps(state, sort_keys=True, default=lambda t: f"{t.dtype}{tuple(t.shape)}:{t.numpy().tobytes().hex()}")


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_changed_shard_is_skipped_and_an_unrestored_sharded_optimizer_is_named(tmp_path: Path) -> None:
    sets = (*SHORT, "train.steps=12", "checkpoint.every_steps=4")
    reference, faulted, unrestored = tmp_path / "reference", tmp_path / "faulted", tmp_path / "unrestored"
    assert run_trainer(FSDP2_GPT, reference, *sets).returncode == 0
    # The periodic checkpoints of the interrupted run are written in the background (checkpoint.async): same files, same bits.
    # verify "warn": the stop checkpoint holds its own shards (under "error" it refers to step 8's state as its replay base).
    stopped = run_trainer(FSDP2_GPT, faulted, *sets, "chaos.signal_at_steps=[8]", "checkpoint.async=true", "checkpoint.verify=warn")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    # Seen once on CI under load: step_4 missing (not reproduced since); the ranks' checkpoint lines say what happened to it.
    said = "\n".join(line for line in stopped.stderr.splitlines() if "checkpoint" in line)
    assert sorted(p.name for p in (faulted / "checkpoints").iterdir()) == ["step_4", "step_8", "step_9"], said
    shutil.copytree(faulted, unrestored)

    flip_byte(faulted / "checkpoints" / "step_9" / "optimizer.shard1.pt")
    resumed = run_trainer(FSDP2_GPT, faulted, *sets)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"skipping checkpoint {faulted / 'checkpoints' / 'step_9'}: optimizer.shard1.pt does not match" in resumed.stderr
    assert "resumed at step 8" in resumed.stderr
    assert manifest(faulted, 12)["global_hash"] == manifest(reference, 12)["global_hash"]
    for rank in range(2):
        assert trajectory(faulted, rank)[-1] == trajectory(reference, rank)[-1]
        for name in ("model", "optimizer"):
            assert shard_bits(faulted, name, rank) == shard_bits(reference, name, rank)

    failed = run_trainer(FSDP2_GPT, unrestored, *sets, "chaos.skip_restore=[optimizer]")
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert "rank 0: optimizer; rank 1: optimizer" in failed.stderr and "Traceback" not in failed.stderr


def stop_from_outside(script: Path, out: Path) -> None:
    """Start the ranks, send SIGUSR2 to rank 1's pid a few steps into the loop, and see both exit 75.

    Steps sleep 0.3 s (chaos, bits unchanged), so the 24 steps outlast the wait; the step the signal lands
    after depends on the machine's load, and the run must end on the same bits wherever that is.
    """
    with reaped(start_ranks(script, out, LEGATO_CHAOS_STEP_SLEEP_S="0.3")) as procs:
        wait_for(lambda: all(catches_usr2(p.pid) for p in procs), 300, "the Session's stop handler")
        time.sleep(2.0)
        os.kill(procs[1].pid, signal.SIGUSR2)
        assert [p.wait(timeout=300) for p in procs] == [75, 75], stderr_tails(out)


def test_torchtitan_style_loop_ported_in_ten_lines_resumes_bitwise(tmp_path: Path) -> None:
    plain, ported = PORT / "fsdp2_plain.py", PORT / "fsdp2_legato.py"
    assert changed_lines(plain, ported) <= 10
    problem = plain_finished(launch(plain, tmp_path / "plain"), tmp_path / "plain")
    assert problem is None, problem
    same = launch(ported, tmp_path / "same")
    assert codes(same) == [0, 0], same[0].stderr[-3000:]
    for rank in range(2):
        assert result(tmp_path / "same", rank) == result(tmp_path / "plain", rank)

    resumed = tmp_path / "resumed"
    stop_from_outside(ported, resumed)
    stop_from_outside(ported, resumed)
    last = launch(ported, resumed)
    assert codes(last) == [0, 0], last[0].stderr[-3000:]
    assert "verified" in last[0].stderr
    reference = tmp_path / "same"
    for rank in range(2):
        assert result(resumed, rank)["params"] == result(tmp_path / "plain", rank)["params"]
        # python's and numpy's global RNGs are never seeded by the loop (nor drawn from): they differ between any two runs.
        ours, theirs = (manifest(run)["ranks"][rank]["components"] for run in (resumed, reference))
        assert {k: v for k, v in ours.items() if k not in UNSEEDED} == {k: v for k, v in theirs.items() if k not in UNSEEDED}
        assert [r["step"] for r in trajectory(resumed, rank)] == list(range(1, 25))
        losses = [[(r["loss_hex"], r["lr"]) for r in trajectory(run, rank)] for run in (resumed, reference)]
        assert losses[0] == losses[1]
        for name in ("model", "optimizer"):
            assert shard_bits(resumed, name, rank, 24) == shard_bits(reference, name, rank, 24)


@NEEDS_CXX
def test_the_torchtitan_style_loop_with_compiled_blocks_resumes_bitwise(tmp_path: Path) -> None:
    """Each transformer block compiled in place before fully_shard (torchtitan's compile option), stopped twice after
    planted steps and relaunched: the same bits as the uninterrupted compiled run, the manifest saying it ran compiled."""
    script = tmp_path / "fsdp2_compiled.py"
    source = (PORT / "fsdp2_legato.py").read_text()
    shard = "for layer in model.layers:\n    fully_shard("
    assert source.count(shard) == 1
    script.write_text(source.replace(shard, "for layer in model.layers:\n    layer.compile()\n    fully_shard("))
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert codes(launch(script, reference)) == [0, 0]
    attempts = [launch(script, resumed, LEGATO_CHAOS_SIGNAL_AT=at, LEGATO_CHAOS_SIGNAL_RANK="1") for at in ("7", "15", "")]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    assert all("verified" in a[0].stderr for a in attempts[1:])
    assert manifest(resumed)["model_compiled"] is True
    for rank in range(2):
        assert result(resumed, rank)["params"] == result(reference, rank)["params"]
        assert [r["loss_hex"] for r in trajectory(resumed, rank)] == [r["loss_hex"] for r in trajectory(reference, rank)]
