"""No thread of legato's starts or ends around a step: the fork stall's cause made impossible, and checked.

A DataLoader forks its workers at an epoch's first batch; a thread ending at that instant can leave the child stuck
in fork() (legato.system.io_threads). The checker compares the process's threads (by ident) across a resume's
reads and across synchronous and asynchronous checkpoints of a real one-rank Session in this process, and catches
a planted per-call thread pool. The stress test forks right after legato's parallel reads and writes, a few hundred
times, each child bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import fit_step

import legato
from legato.store import filehash
from legato.system.io_threads import THREADS, io_map, start

STEPS = 12


def threads_now() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def _session(run_dir: Path, background: bool) -> tuple[legato.Session, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    policy = legato.CheckpointPolicy(every_steps=3, replay_steps=2, replay_cost=0, every_minutes=0, async_=background)
    return legato.Session(run_dir, model=model, optimizer=optimizer, total_steps=STEPS, checkpoint=policy), model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)) for _ in range(STEPS)]


@contextlib.contextmanager
def threads_started() -> Iterator[list[str]]:
    """The names of the threads started inside the block (Thread.start observed, not changed)."""
    names: list[str] = []
    original = threading.Thread.start

    def start_counted(thread: threading.Thread) -> None:
        names.append(thread.name)
        original(thread)

    threading.Thread.start = start_counted  # type: ignore[method-assign]
    try:
        yield names
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]


def threads_changed_around_steps(run_dir: Path, background: bool, leave_at: int | None = None) -> list[str]:
    """Each thread started, or ended, once the Session was made: through its resume's reads, up to its last step."""
    session, model = _session(run_dir, background)
    batches, before, changes = _batches(), threads_now(), []
    with threads_started() as started:
        for step in session:
            session.report(fit_step(model, session.optimizer, *batches[step]))
            if before - threads_now():
                changes.append(f"a thread ended before step {step + 1}")
            if step == leave_at:
                break
        changes += [f"thread {name} started" for name in started]
    return changes


@pytest.mark.parametrize("background", [False, True])
def test_checkpoints_and_a_resume_start_and_end_no_thread(tmp_path: Path, background: bool) -> None:
    assert threads_changed_around_steps(tmp_path, background, leave_at=7) == []  # checkpoints at 3 and 6
    assert threads_changed_around_steps(tmp_path, background) == []  # resumes from 6 (a replay from 4), then to the end


def test_the_checker_catches_a_thread_pool_made_per_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def per_call(fn, items):  # the planted fault: what the writes did before, threads that end as each returns
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(fn, items))

    monkeypatch.setattr(filehash, "io_map", per_call)
    assert any("started" in change for change in threads_changed_around_steps(tmp_path, background=False))


def test_the_pool_starts_every_thread_at_once_and_a_forked_child_starts_its_own() -> None:
    pool = start()
    names = {t.name for t in threading.enumerate() if t.name.startswith("legato-io")}
    assert len(names) == THREADS and start() is pool
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child has the pool object but none of its threads: it must not wait on them
        try:
            os.write(write, str(sum(io_map(int, ["1", "2"]))).encode())
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 16) == b"3"
    os.waitpid(child, 0)


def test_forks_right_after_parallel_writes_and_reads_never_hang(tmp_path: Path) -> None:
    """Each fork comes the instant legato's parallel file writes or reads return, as a loader's first batch does."""
    state = {"w": torch.randn(64, 64)}
    files = {tmp_path / f"f{i}.pt": state for i in range(3)}
    hung = []
    for i in range(100):
        filehash.save_all(files, {}) if i % 2 == 0 else io_map(lambda p: p.stat().st_size, list(files))
        child = os.fork()
        if child == 0:
            os._exit(0)
        deadline = time.monotonic() + 30
        while os.waitpid(child, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                hung.append(i)
                break
            time.sleep(0.001)
    assert hung == []
