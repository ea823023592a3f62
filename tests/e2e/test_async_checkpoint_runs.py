"""Asynchronous checkpoints keep every guarantee of the synchronous ones, with real processes.

2 ranks, gloo, real signals: an asynchronous run stopped by a signal resumes
bit for bit, its checkpoints hold exactly the states a synchronous run writes
at the same steps, and a SIGKILL during a background write (every rank inside
the writer, or one rank from outside at a random moment) leaves the previous
checkpoint usable and the resume exact. In one process: unit/test_async_checkpoint.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, assert_bitwise_equal, manifest, resumed_steps, run_to_completion, run_trainer
from helpers.launches import reaped, start_ranks, stderr_tails

STEPS = 30
STOP_ONCE = ROOT / "tests" / "helpers" / "stop_once.py"
ASYNC = ("checkpoint.async=true", "checkpoint.every_steps=4", "checkpoint.keep_last=100")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted synchronous run writing a checkpoint every 4 steps, all kept."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_to_completion(TINY_GPT, run_dir, *FAST_GPT, "checkpoint.async=false", "checkpoint.every_steps=4", "checkpoint.keep_last=100")
    return run_dir


@pytest.mark.slow
def test_async_run_stopped_by_a_signal_resumes_bitwise(reference: Path, tmp_path: Path) -> None:
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, *ASYNC, "chaos.signal_rank=1", "chaos.signal_at_steps=[12]")
    assert [a.returncode for a in attempts] == [75, 0]
    # The stop waited for the write of step 12 in flight, committed it, then wrote the stop checkpoint.
    assert "asynchronous checkpoint step 12 committed" in attempts[0].stderr
    assert resumed_steps(attempts) == [13]
    assert_bitwise_equal(reference, tmp_path, STEPS)
    for step in (4, 8, 12, 16, 20, 24, 28):
        ours, theirs = manifest(tmp_path, step), manifest(reference, step)
        assert ours["global_hash"] == theirs["global_hash"] and same_replay(ours) == same_replay(theirs), step


def same_replay(m: dict) -> dict:
    """A manifest's replay section as two runs on one trajectory share it: a base referred to is listed with its files'
    sizes and hashes, and those depend on the memory the writer pickled (the live tensors or the staged copies), not
    only on the bits, so the listing is compared by file name (the base's bits are in its digests)."""
    replay = dict(m["replay"])
    if "base" in replay:
        replay["base"] = {**replay["base"], "files": sorted(replay["base"]["files"])}
    return replay


@pytest.mark.slow
def test_sigkill_inside_the_background_write_leaves_the_previous_checkpoint(reference: Path, tmp_path: Path) -> None:
    killed = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, *ASYNC, "chaos.kill_in_checkpoint=12", "chaos.kill_point=after_shards")
    assert killed.returncode not in (0, 75)
    assert not (tmp_path / "checkpoints" / "step_12").exists()
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, *ASYNC)
    assert resumed_steps(attempts) == [8]
    assert_bitwise_equal(reference, tmp_path, STEPS)


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of one rank among the launcher's children: by its name (a rank the launcher forked shows the launcher's
    command line and environment in /proc), else by RANK in the environment it was started with."""
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                name = Path(f"/proc/{child}/comm").read_text().strip()
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if name == f"legato-rank{rank}" or f"RANK={rank}".encode() in env:
                return int(child)
    return None


@pytest.mark.slow
def test_external_sigkill_of_one_rank_during_a_background_write(reference: Path, tmp_path: Path) -> None:
    """SIGKILL rank 1 alone as soon as an asynchronous write is seen in flight, after a random extra delay."""
    rnd = random.Random(os.getpid())
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={tmp_path}"]
    for item in (*FAST_GPT, *ASYNC[:1], "checkpoint.every_steps=2"):
        cmd += ["--set", item]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        root = tmp_path / "checkpoints"
        while not list(root.glob(".tmp_step_*")) or not list(root.glob("step_*")):
            assert time.monotonic() < deadline and launcher.poll() is None, "no background write seen"
            time.sleep(0.001)
        time.sleep(rnd.uniform(0, 0.05))
        victim = _rank_pid(launcher.pid, 1)
        assert victim is not None, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)
        assert launcher.wait(timeout=120) not in (0, 75)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, *ASYNC)
    assert len(resumed_steps(attempts)) == 1
    assert_bitwise_equal(reference, tmp_path, STEPS)


@pytest.mark.slow
def test_a_bug_in_one_ranks_background_writer_ends_every_rank_naming_it_never_as_a_full_disk(tmp_path: Path) -> None:
    """tests/helpers/stop_once.py, periodic checkpoints every 4 steps in the background; rank 1's writer raises a planted
    KeyError as it writes step 8's files. Both ranks abandon step 8 at the same agreed step and exchange why: rank 1
    raises its own error with its traceback, rank 0 an error naming rank 1's. No rank waits for the other, none blames
    the disk, and step 4 stands."""
    with reaped(start_ranks(STOP_ONCE, tmp_path, 2, ASYNC="1", EVERY_STEPS="4", WRITER_BUG="1:8")) as procs:
        codes = [p.wait(timeout=300) for p in procs]
    rank0, rank1 = ((tmp_path / f"rank{rank}.stderr").read_text() for rank in range(2))
    assert codes == [1, 1], stderr_tails(tmp_path)
    assert "KeyError: 'planted'" in rank1, rank1[-3000:]
    assert "a background writer failed with an error of its own (rank 1: KeyError('planted'))" in rank0, rank0[-3000:]
    assert "free space" not in rank0 + rank1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_4"]
