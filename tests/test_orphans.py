"""No orphans: a SIGKILLed local launcher takes its ranks and their DataLoader workers with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, TINY_GPT


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone: it holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_sigkill_of_the_launcher_leaves_no_rank_or_worker(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={tmp_path / 'run'}",
           "--set", "train.steps=1000000", "--set", "train.num_workers=2", "--set", "chaos.signal_at_steps=[]",
           "--set", "checkpoint.every_steps=0"]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    seen: set[int] = set()
    try:
        # Two ranks and two DataLoader workers each: the run's six processes, all training.
        def all_up() -> bool:
            seen.update(descendants(launcher.pid))
            return len([p for p in descendants(launcher.pid) if alive(p)]) >= 6 and (tmp_path / "run" / "trajectory").is_dir()

        wait_until(all_up, 180, "the ranks and their workers")
        seen.update(descendants(launcher.pid))
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_until(lambda: not any(alive(p) for p in seen), 60, f"every process of the run to end: {sorted(p for p in seen if alive(p))}")
        assert len(seen) >= 6
    finally:
        launcher.kill()
        launcher.wait()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
