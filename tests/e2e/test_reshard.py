"""Resuming an FSDP2 run on another world size (checkpoint.reshard), with real ranks (gloo, CPU) and real signals.

tests/helpers/fsdp2_reshard.py runs at 2 ranks, is stopped by SIGUSR2 sent from here to a rank's pid, and
resumes at 4 ranks with the opt-in (and a 4-rank run the other way, at 2), is stopped again and resumes at its
new world size as usual (replay-verified). Checked:

- every parameter and optimizer state, gathered into full tensors right after the resharded resume, equals the
  full tensors assembled from the checkpoint's shard files (torch.equal: bit for bit); the stop checkpoint holds its
  replay base only (state_by_replay), so those are the base's files, and the new ranks go on from the base's step
  and write no checkpoint before the stop checkpoint's step;
- over the whole run each sample is seen exactly once per epoch, and each step's samples are the global batch
  an uninterrupted run at the first world size takes at that step (the same global order);
- the ledger's RESUMED record carries {"from", "to"}, and `legato status` shows "resharded N -> M ranks: data
  position exact, not bitwise";
- without the opt-in the resume exits 2 with one paragraph naming checkpoint.reshard, and no traceback;
- the bundled trainer on configs/tiny_gpt_fsdp2.yaml, 2 ranks stopped by chaos, resumes at 4 with
  checkpoint.reshard: true and train.batch_size halved; the per-rank batch left as it was is refused (the global
  batch would double), naming the batch size to set;
- planted fault: the global batch changed along with the world size (the data position would not be exact) is
  refused, exit 2, naming the global batch.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import ROOT, manifest, run_trainer
from helpers.cli import legato, wait_for
from helpers.launches import catches_usr2, reaped, start_ranks
from test_fsdp2 import FSDP2_GPT, SHORT

from legato.state.sharded import MARK

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "fsdp2_reshard.py"
LABEL = "resharded {} -> {} ranks: data position exact, not bitwise"


def run(out: Path, world: int, **env: str) -> list[int]:
    with reaped(start_ranks(SCRIPT, out, world, **env)) as procs:
        return [p.wait(timeout=300) for p in procs]


def stop_from_outside(out: Path, world: int, logged: int = 3, **env: str) -> list[int]:
    """Start `world` ranks, send SIGUSR2 to the last rank's pid once `logged` steps ran, and wait for them."""
    samples = out / f"samples_rank0_ws{world}.jsonl"
    with reaped(start_ranks(SCRIPT, out, world, LEGATO_CHAOS_STEP_SLEEP_S="0.2", **env)) as procs:
        wait_for(lambda: all(catches_usr2(p.pid) for p in procs), 300, "the Session's stop handler")
        wait_for(lambda: samples.is_file() and len(samples.read_text().splitlines()) >= logged, 300, f"{logged} steps")
        os.kill(procs[-1].pid, signal.SIGUSR2)
        return [p.wait(timeout=300) for p in procs]


def steps(out: Path, world: int) -> dict[int, list[int]]:
    """Step -> the sorted samples all `world` ranks took at that step, from their logs."""
    taken: dict[int, list[int]] = {}
    for rank in range(world):
        path = out / f"samples_rank{rank}_ws{world}.jsonl"
        for line in path.read_text().splitlines() if path.is_file() else []:
            record = json.loads(line)
            taken.setdefault(record["step"], []).extend(record["samples"])
    return {step: sorted(samples) for step, samples in taken.items()}


def full_tensors(checkpoint: Path, name: str, world: int) -> dict:
    """The full tensors of sharded component `name`, assembled from every rank's shard records of `checkpoint`."""
    trees = [torch.load(checkpoint / f"{name}.shard{r}.pt", weights_only=True) for r in range(world)]

    def assemble(nodes: list):
        first = nodes[0]
        if isinstance(first, dict) and set(first) == {MARK}:
            whole = torch.empty(first[MARK]["shape"], dtype=first[MARK]["local"].dtype)
            for node in nodes:
                record = node[MARK]
                index = tuple(slice(o, o + n) for o, n in zip(record["offsets"], record["local_shape"]))
                whole[index] = record["local"]
            return whole
        if isinstance(first, dict):
            return {k: assemble([n[k] for n in nodes]) for k in first}
        if isinstance(first, list):
            return [assemble([n[i] for n in nodes]) for i in range(len(first))]
        return first

    return assemble(trees)


def assert_equal(ours, theirs, where: str = "") -> None:
    if isinstance(theirs, torch.Tensor):
        assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype, where
    elif isinstance(theirs, dict):
        assert set(ours) == set(theirs), where
        for k in theirs:
            assert_equal(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_equal(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


@pytest.mark.parametrize("before, after", [(2, 4), (4, 2)])
def test_a_stopped_fsdp2_run_resumes_resharded_with_the_data_position_exact(tmp_path: Path, before: int, after: int) -> None:
    reference = tmp_path / "reference"
    assert run(reference, before) == [0] * before
    out = tmp_path / "run"
    assert stop_from_outside(out, before) == [75] * before
    stopped = manifest(out)
    assert stopped["world_size"] == before

    refused = run(out, after)
    assert refused == [2] * after
    stderr = (out / "rank0.stderr").read_text()
    assert "checkpoint.reshard: true" in stderr and "CheckpointPolicy(reshard=True)" in stderr and "Traceback" not in stderr

    # The stop checkpoint holds its replay base only: resharded from it, the new ranks run again from the base's step
    # (they log those steps too) and stop past the stop checkpoint's step, so that theirs is the newest.
    base = stopped["replay"]["from_step"] if stopped.get("state_by_replay") else stopped["step"]
    logged = stopped["step"] - base + 3
    assert stop_from_outside(out, after, logged, RESHARD="1") == [75] * after, (out / "rank0.stderr").read_text()[-3000:]
    assert LABEL.format(before, after) in (out / "rank0.stderr").read_text()
    # Then an ordinary resume at the new world size: replay-verified from a base written by the new ranks.
    assert run(out, after, RESHARD="1") == [0] * after, (out / "rank0.stderr").read_text()[-3000:]
    assert "verified by a replay" in (out / "rank0.stderr").read_text()

    # The state resharded is the stop checkpoint's replay base (in its own directory: no earlier checkpoint held it).
    checkpoint = out / "checkpoints" / f"step_{stopped['step']}"
    prefix = "replay_" if stopped.get("state_by_replay") else ""
    assert "base" not in stopped.get("replay", {})
    resumed = torch.load(out / f"resume_point_ws{after}.pt", weights_only=True)
    assert_equal(resumed["model"], full_tensors(checkpoint, f"{prefix}model", before), "model")
    assert_equal(resumed["optimizer"], full_tensors(checkpoint, f"{prefix}optimizer", before), "optimizer")

    taken = {**steps(out, before), **steps(out, after)}
    assert sorted(taken) == sorted(steps(reference, before))
    assert taken == steps(reference, before)  # each step's global batch: the uninterrupted run's
    per_epoch = Counter()
    for step, samples in taken.items():
        per_epoch.update((step // 6, s) for s in samples)
    assert set(per_epoch.values()) == {1} and len(per_epoch) == 36 * 16

    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()] if (out / "ledger.jsonl").is_file() else []
    records = [e for e in ledger if e["event"] == "resumed" and e.get("resharded")]
    assert [e["resharded"] for e in records] == [{"from": before, "to": after}]
    status = legato("status", str(out))
    assert status.returncode == 0, status.stderr
    assert LABEL.format(before, after) in status.stdout


@pytest.mark.parametrize("global_batch", [32, 8])
def test_a_changed_global_batch_is_refused(tmp_path: Path, global_batch: int) -> None:
    out = tmp_path / "run"
    # Slow steps: the ranks agree about once a second, so the stop lands a step or two after 2, inside the first epoch
    # (6 steps): at an epoch's first step a changed global batch is not seen (docs/fsdp2.md).
    # A replay base every step: the stop checkpoint, which holds its base only, is resharded from step N - 1, inside the epoch too.
    assert run(out, 2, LEGATO_CHAOS_SIGNAL_AT="2", LEGATO_CHAOS_STEP_SLEEP_S="0.5", REPLAY_STEPS="1") == [75, 75]
    assert 0 < manifest(out)["step"] < 6 and manifest(out)["replay"]["from_step"] > 0
    assert run(out, 4, RESHARD="1", GLOBAL_BATCH=str(global_batch)) == [2] * 4
    stderr = (out / "rank0.stderr").read_text()
    assert "global batch (per-rank batch x ranks)" in stderr and "Traceback" not in stderr, stderr[-3000:]


def test_the_bundled_fsdp2_trainer_resumes_resharded_through_its_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stopped = run_trainer(FSDP2_GPT, run_dir, *SHORT, "chaos.signal_at_steps=[5]")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    four = (*SHORT, "local.tasks=4")
    refused = run_trainer(FSDP2_GPT, run_dir, *four, nproc=4)
    assert refused.returncode == 2 and "checkpoint.reshard: true" in refused.stderr and "Traceback" not in refused.stderr
    doubled = run_trainer(FSDP2_GPT, run_dir, *four, "checkpoint.reshard=true", nproc=4)
    assert doubled.returncode == 2 and "train.batch_size: 4 for 4 ranks" in doubled.stderr, doubled.stderr[-3000:]
    done = run_trainer(FSDP2_GPT, run_dir, *four, "checkpoint.reshard=true", "train.batch_size=4", nproc=4, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert LABEL.format(2, 4) in done.stderr
    assert manifest(run_dir, 16)["world_size"] == 4
