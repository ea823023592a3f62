"""The run directory's attempt lock between real processes: a held directory refuses the next launch by name, a
hard-killed holder frees it at once even while the DataLoader-style child it forked lives on, and a launch that is
ending is waited for; `legato run` into a directory a launch holds is refused before it records anything. No
training runs here: each holder is a small Python process taking the lock as rank 0 does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.cli import assert_usage_error, legato, run_args

from legato.dist.peers import Peers
from legato.errors import UsageError
from legato.session.attempt_lock import AttemptLock
from legato.system.processes import alive

ALONE = Peers(0, 1, None)

# Takes the lock, forks a child that sleeps (as a DataLoader worker would), says both pids, lives `hold` seconds and
# says it is ending: the lock goes with the process's exit, after that line.
HOLDER = textwrap.dedent("""
    import os, sys, time
    from legato.dist.peers import Peers
    from legato.session.attempt_lock import AttemptLock
    lock = AttemptLock.claim(sys.argv[1], Peers(0, 1, None))
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print(os.getpid(), child, flush=True)
    time.sleep(float(sys.argv[2]))
    print("ending", flush=True)
""")


@pytest.fixture
def holders():
    """Start holders of a run directory; every process they started is killed at the end, whatever happened."""
    started: list[tuple[subprocess.Popen, int]] = []

    def start(run_dir: Path, hold: float) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), str(hold)], stdout=subprocess.PIPE, text=True)
        pid, child = map(int, proc.stdout.readline().split())
        assert pid == proc.pid
        started.append((proc, child))
        return proc, child

    yield start
    for proc, child in started:
        proc.kill()
        proc.wait(timeout=60)
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_held_run_directory_refuses_the_next_launch_naming_its_holder(tmp_path: Path, holders) -> None:
    holder, _ = holders(tmp_path, 600)
    written = (tmp_path / "attempt.lock").read_text()
    with pytest.raises(UsageError) as refused:
        AttemptLock.claim(tmp_path, ALONE, wait_s=0.5)
    message = str(refused.value)
    assert f"Another launch is training in {tmp_path} (pid {holder.pid} on {socket.gethostname()}, since " in message
    assert "give this launch its own run directory" in message and "\n" not in message
    assert (tmp_path / "attempt.lock").read_text() == written, "the refused launch touched the holder's line"


def test_a_hard_killed_holder_frees_the_directory_while_its_forked_child_lives(tmp_path: Path, holders) -> None:
    holder, child = holders(tmp_path, 600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    lock = AttemptLock.claim(tmp_path, ALONE, wait_s=60)
    assert alive(child), "the forked child died with its parent: the test no longer shows that it holds no lock"
    assert f'"pid": {os.getpid()},' in (tmp_path / "attempt.lock").read_text()
    lock.release()


def test_a_launch_that_is_ending_is_waited_for_and_released_locks_are_taken_again(tmp_path: Path, holders) -> None:
    holder, _ = holders(tmp_path, 1.5)
    lock = AttemptLock.claim(tmp_path, ALONE, wait_s=120)
    assert holder.stdout.readline() == "ending\n", "the lock was taken before its holder ended"
    lock.release()
    lock.release()
    again, _ = holders(tmp_path, 600)
    assert f'"pid": {again.pid},' in (tmp_path / "attempt.lock").read_text()


def test_legato_run_into_a_directory_a_launch_holds_is_refused_before_it_records_anything(tmp_path: Path, holders) -> None:
    """A script's own launch trains in the run directory (here: its rank 0's lock); `legato run` there says who holds
    it, exit 2, and leaves the directory as it found it (no config, no ledger, no job)."""
    run_dir = tmp_path / "run"
    holder, _ = holders(run_dir, 600)
    before = sorted(p.name for p in run_dir.iterdir())
    refused = legato(*run_args(run_dir))
    assert_usage_error(refused, f"Another launch is training in {run_dir} (pid {holder.pid} on ")
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("supervisor.")) == before
