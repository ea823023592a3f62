"""Launching ranks and watching them from outside, as a scheduler would: how far rank 0 trained, whether a rank
has its stop handler in place, and every process under it; no process a test started outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from helpers import warm

from legato.runtime.launch import free_port
from legato.system.processes import children

ROOT = Path(__file__).resolve().parents[2]
_STDERR: dict[int, Path] = {}  # pid -> the stderr file start_ranks gave it, for a hung rank's stacks


def start_ranks(script: Path, out: Path, world: int = 2, **env: str) -> list[subprocess.Popen]:
    """`world` ranks of `script` (argument: `out`) on a free local port, each rank's stderr in `out`/rank<r>.stderr."""
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    procs = [
        # stderr to a file, never a pipe nobody reads while the ranks run: a full pipe blocks a rank holding its logging lock.
        warm.start(
            [sys.executable, str(script), str(out)],
            stderr=(out / f"rank{rank}.stderr").open("w"),
            env=dict(
                os.environ,
                PYTHONHASHSEED="0",
                RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                PYTHONWARNINGS="ignore",
                PYTHONPATH=str(ROOT),
                **env,
            ),
        )
        for rank in range(world)
    ]
    _STDERR.update({p.pid: out / f"rank{rank}.stderr" for rank, p in enumerate(procs)})
    return procs


def stderr_tails(out: Path, world: int = 2, chars: int = 3000) -> str:
    """The end of every rank's stderr file under `out` (see start_ranks), for an assertion's message."""
    return "\n".join(f"--- rank {rank}:\n{(out / f'rank{rank}.stderr').read_text()[-chars:]}" for rank in range(world))


@contextmanager
def reaped(procs: list[subprocess.Popen]) -> Iterator[list[subprocess.Popen]]:
    """`procs`, killed and waited for on the way out if still running (a failed wait or assertion leaves none behind).

    When the test fails with some still running, they get SIGABRT first: PYTHONFAULTHANDLER (tests/conftest.py sets it
    for every process) turns it into every thread's stack on their stderr, which the failure's notes then carry."""
    try:
        yield procs
    except Exception as exc:
        exc.add_note(_stacks_of_the_running(procs))
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            _STDERR.pop(p.pid, None)  # the pid may be reused by a later process


def _stacks_of_the_running(procs: list[subprocess.Popen]) -> str:
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGABRT)
    for p in running:
        with suppress(subprocess.TimeoutExpired):
            p.wait(timeout=30)
    notes = [
        f"--- pid {p.pid} ({_STDERR.get(p.pid, 'stderr not in a file')}), still running at the failure; SIGABRT's stacks:\n"
        f"{_STDERR[p.pid].read_text()[-6000:] if p.pid in _STDERR else ''}"
        for p in running
    ]
    return "\n".join(notes) or "no process of the test was still running at the failure"


def catches_usr2(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGUSR2 installed (the Session installs it before the loop)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGUSR2 - 1)))


def steps_done(run: Path) -> int:
    """Steps rank 0 logged to its trajectory so far (0 before it opened one)."""
    path = run / "trajectory" / "rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def process_tree(pid: int) -> list[int]:
    """Every descendant of `pid` alive now (children first, then theirs)."""
    found = []
    for child in children(pid):
        found += [child, *process_tree(child)]
    return found
