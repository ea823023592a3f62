"""What the proof costs on steps that save nothing: no state hash, and replay bases spaced by what their copies cost.

One rank in this process (a Session without a process group runs as world size 1), a model with a frozen "ballast"
parameter (a frozen embedding as in fine-tuning) whose size is the state's, and a trainable part that is not. Counted,
not timed: the bytes handed to the digest (`legato.state.hashing.raw_digest`, wrapped to count) and the base copies
(`Snapshot.take`, wrapped to count) over the boundaries of steps 5 to 94, away from the attempt's start and its final
checkpoint. The cost bound acts on measured times, so its test gives it a copy thousands of times a step's cost share
(128 MiB against sub-millisecond steps); tests/e2e/test_cost_spaced_bases.py has the same with two real ranks agreeing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import legato
from legato.errors import UsageError
from legato.session.policy import HASH_ENV
from legato.state import hashing
from legato.state.snapshot import Snapshot

STEPS, WINDOW = 100, range(5, 95)


class Counts:
    def __init__(self) -> None:
        self.on = False
        self.hashed = 0
        self.copies: list[int] = []


def run(run_dir: Path, ballast_mb: int, policy: legato.CheckpointPolicy, counts: Counts, stop_after: int | None = None) -> legato.Session:
    legato.seed_everything(3, rank=0, mode="fast")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    model.register_parameter("ballast", torch.nn.Parameter(torch.randn(ballast_mb << 18), requires_grad=False))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    loader = legato.resumable_loader(torch.utils.data.TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4, seed=3)
    chaos = legato.Chaos(signal_at_steps=(stop_after,)) if stop_after else legato.Chaos()
    session = legato.Session(run_dir, model=model, optimizer=optimizer, loader=loader, total_steps=STEPS, checkpoint=policy, chaos=chaos)
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.report(loss)
        counts.on = session.step in WINDOW  # this step's boundary runs when the loop asks for the next batch
    counts.on = False
    return session


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    counts, digest, take = Counts(), hashing.raw_digest, Snapshot.take

    def counted_digest(data: Any) -> bytes:
        if counts.on:
            counts.hashed += memoryview(data).nbytes
        return digest(data)

    def counted_take(self: Snapshot, step: int, *args: Any) -> None:
        if counts.on:
            counts.copies.append(step)
        take(self, step, *args)

    monkeypatch.setattr(hashing, "raw_digest", counted_digest)
    monkeypatch.setattr(Snapshot, "take", counted_take)
    return counts


def test_the_defaults_hash_no_state_on_a_step_that_saves_nothing(tmp_path: Path, counts: Counts) -> None:
    """Steps rule alone (replay_cost 0), so both sizes take the same bases: what is hashed is the batches' and the first
    step's gradients' fingerprints, the same at 1 and 16 MiB of state; with hash_every_steps 10, the state each time."""
    policy = legato.CheckpointPolicy(every_minutes=0, replay_cost=0)
    hashed, copies = [], []
    for mb in (1, 16):
        counts.hashed, counts.copies = 0, []
        run(tmp_path / f"mb{mb}", mb, policy, counts)
        hashed.append(counts.hashed)
        copies.append(counts.copies)
    assert hashed[0] == hashed[1] and hashed[0] < 1 << 20, hashed
    assert copies == [[32, 64], [32, 64]]
    counts.hashed = 0
    run(tmp_path / "hashed", 16, legato.CheckpointPolicy(every_minutes=0, replay_cost=0, hash_every_steps=10), counts)
    assert counts.hashed >= 9 * (16 << 20), counts.hashed  # the planted cost the default no longer pays: 9 state hashes


def test_a_large_base_is_copied_less_often_and_the_resume_from_it_replays_bitwise(tmp_path: Path, counts: Counts) -> None:
    policy = legato.CheckpointPolicy(every_minutes=0)
    reference = run(tmp_path / "reference", 128, policy, counts)
    assert counts.copies == [32], counts.copies  # the steps rule alone would copy at 32 and 64
    stopped = run(tmp_path / "run", 128, policy, Counts(), stop_after=90)
    assert stopped.exit_code == legato.EXIT_STOPPED
    resumed = run(tmp_path / "run", 128, policy, Counts())
    assert resumed.exit_code == 0
    assert resumed.resumed is not None and resumed.resumed.replay is not None
    assert (resumed.resumed.replay.from_step, resumed.resumed.replay.identical) == (32, True)
    finals = [json.loads((r.run_dir / "checkpoints" / f"step_{STEPS}" / "manifest.json").read_text()) for r in (reference, resumed)]
    assert finals[0]["global_hash"] == finals[1]["global_hash"]


def test_the_launcher_sets_the_trajectory_hash_and_a_bad_value_is_refused() -> None:
    base = legato.CheckpointPolicy()
    assert base.hash_every_steps == 0 and base.replay_cost == 0.02
    assert base.from_env({}) is base
    assert base.from_env({HASH_ENV: "1"}).hash_every_steps == 1
    with pytest.raises(UsageError) as refused:
        base.from_env({HASH_ENV: "-1"})
    assert HASH_ENV in str(refused.value) and "\n" not in str(refused.value)
