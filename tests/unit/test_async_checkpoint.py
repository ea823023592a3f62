"""Asynchronous checkpoints keep every guarantee of the synchronous ones, in one process.

One rank, no group: a checkpoint in flight is never selectable, never counted
in keep_last, never lets pruning remove the newest verified one, and one due
meanwhile waits for it and says so. The background writer is held back with an
event so that "in flight" is a state the test controls, not a race it hopes to
win. The writer thread runs at nice 19 while the training thread keeps its
priority. The same guarantees with real processes: e2e/test_async_checkpoint_runs.py.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import legato
from legato.store import commit, trajectory
from legato.store.async_checkpoint import AsyncCheckpointer, Job
from legato.store.manifest import list_checkpoints, read_manifest
from legato.store.resumable import newest_usable
from legato.store.trajectory import read_trajectory
from legato.store.writers import Synchronous


def small_run(run_dir: Path, steps: int, policy: legato.CheckpointPolicy, on_step=None) -> legato.Session:
    legato.seed_everything(7, rank=0, mode="fast")
    features = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(features, features.sum(1, keepdim=True))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        loader=legato.resumable_loader(data, batch_size=8, seed=7),
        total_steps=steps,
        checkpoint=policy,
    )
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        session.report(loss)
        if on_step is not None:
            on_step(session)
    return session


def test_in_flight_checkpoint_is_never_selected_counted_or_pruned_for_and_the_next_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    release = threading.Event()
    real = commit.write_files
    seen: dict[int, tuple] = {}

    def held_write(directory: Path, files: dict, known: tuple = ()) -> dict:
        if directory.name.endswith("_4"):
            assert release.wait(60), "the test never released the writer"
        return real(directory, files, known)

    def look(session: legato.Session) -> None:
        root = session.checkpoint_root
        if session.step == 3:
            if session._saving.periodic.in_flight is not None:
                session._saving.periodic.in_flight.future.result(60)  # step 2's write is done: step 4's boundary commits it at the latest
            finish = session._saving.periodic.finish
            # Step 4's writer is held until step 6's checkpoint waits for it: then "in flight" is certain, not a race.
            session._saving.periodic.finish = lambda: (release.set(), finish())[1]
        if session.step in (4, 5):
            found = newest_usable(root)
            seen[session.step] = (
                [p.name for p in list_checkpoints(root)],
                found[0].name if found else None,
                (root / ".tmp_step_4").is_dir(),
            )

    monkeypatch.setattr(commit, "write_files", held_write)
    policy = legato.CheckpointPolicy(every_steps=2, keep_last=1, hash_every_steps=1, agree_every_steps=1, replay_steps=0, async_=True)
    with caplog.at_level(logging.INFO, logger="legato"):
        session = small_run(tmp_path, 8, policy, look)
    # While step 4 was in flight, step 2 stayed the newest and only checkpoint, despite keep_last=1.
    assert seen[4] == seen[5] == (["step_2"], "step_2", True)
    assert "periodic checkpoint at step 6 waits for the one of step 4, still being written" in caplog.text
    assert session.exit_code == 0
    assert [p.name for p in list_checkpoints(session.checkpoint_root)] == ["step_8"]
    assert "asynchronous checkpoint step 6 committed" in caplog.text
    assert not list(session.checkpoint_root.glob(".tmp_*"))


def test_async_and_sync_checkpoints_hold_the_same_state_in_process(tmp_path: Path) -> None:
    runs = {}
    for mode in (False, True):
        policy = legato.CheckpointPolicy(
            every_steps=3, keep_last=100, hash_every_steps=1, agree_every_steps=1, replay_steps=2, replay_cost=0, async_=mode
        )
        run_dir = tmp_path / f"async_{mode}"
        assert small_run(run_dir, 9, policy).exit_code == 0
        runs[mode] = {p.name: read_manifest(p) for p in list_checkpoints(run_dir / "checkpoints")}
    assert sorted(runs[True]) == sorted(runs[False]) == ["step_3", "step_6", "step_9"]
    for name in runs[True]:
        sync, background = runs[False][name], runs[True][name]
        assert background["global_hash"] == sync["global_hash"]
        assert background["ranks"] == sync["ranks"] and background.get("replay") == sync.get("replay")
        assert [e["cpu_capability"] for e in background["ranks"]] == [torch.backends.cpu.get_cpu_capability()]


def test_unset_async_is_off_for_a_model_on_the_cpu(tmp_path: Path) -> None:
    """The default (async_ None) follows where the model lives: on for a GPU (tests/e2e/test_cuda.py proves that run), off
    here, where the two measured a tie; an explicit True still switches it on."""
    unset = legato.CheckpointPolicy(every_steps=3, hash_every_steps=1, agree_every_steps=1, replay_steps=0)
    assert unset.async_ is None
    assert isinstance(small_run(tmp_path / "unset", 3, unset)._saving.periodic, Synchronous)
    on = legato.CheckpointPolicy(every_steps=3, hash_every_steps=1, agree_every_steps=1, replay_steps=0, async_=True)
    assert isinstance(small_run(tmp_path / "on", 3, on)._saving.periodic, AsyncCheckpointer)


def test_the_writer_thread_runs_at_low_priority_and_the_training_thread_keeps_its_own(tmp_path: Path) -> None:
    from legato.store.async_checkpoint import WRITER_NICE

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = nice()
    writer = AsyncCheckpointer(tmp_path, 0, 1, None, keep_last=1, kill=None)
    try:
        assert writer._executor.submit(nice).result(60) == max(before, WRITER_NICE)
        assert nice() == before
    finally:
        writer.close()


def test_the_step_an_async_checkpoint_covers_is_in_the_trajectory_file_before_its_writer_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume keeps the trajectory's lines up to its checkpoint's step: a rank SIGKILLed right after the background
    commit of step 4, its step-4 line still in the writer's buffer, left its trajectory without step 4 for good (an
    e2e kill found it, test_async_checkpoint_runs). The line must reach the file before the checkpoint can."""
    monkeypatch.setattr(trajectory, "FLUSH_INTERVAL_S", float("inf"))  # only a sync writes, as in a loop of fast steps
    on_disk: dict[int, list[int]] = {}

    def look(session: legato.Session) -> None:
        periodic = session._saving.periodic
        if session.step == 1:
            start = periodic.start

            def start_seen(job: Job) -> None:
                on_disk[job.step] = [r["step"] for r in read_trajectory(tmp_path / "trajectory" / "rank0.jsonl")]
                start(job)

            periodic.start = start_seen

    policy = legato.CheckpointPolicy(every_steps=2, keep_last=10, hash_every_steps=0, agree_every_steps=1, replay_steps=0, async_=True)
    assert small_run(tmp_path, 6, policy, look).exit_code == 0
    assert sorted(on_disk) == [2, 4]
    for step, steps in on_disk.items():
        assert steps == list(range(1, step + 1)), (step, steps)
