"""Threads from the allocation, with real processes: a 2-rank run resumed under another thread count is refused
in strict mode and goes on in fast mode (the rule itself, in one process: unit/test_threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, manifest


def trainer(run_dir: Path, cpus: str, *sets: str) -> subprocess.CompletedProcess:
    """A 2-rank trainer run whose allocation says `cpus` CPUs per task."""
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={run_dir}"]
    for item in (*FAST_GPT, "train.steps=6", "train.num_workers=0", *sets):
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLURM_CPUS_PER_TASK=cpus)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "fast"])
def test_resume_with_another_thread_count(tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / "run"
    first = trainer(run_dir, "1", f"determinism.mode={mode}", "chaos.signal_at_steps=[2]")
    assert first.returncode == 75, first.stderr[-3000:]
    assert manifest(run_dir)["threads"] == 1 and "1 (from SLURM_CPUS_PER_TASK) torch threads" in first.stderr
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    second = trainer(run_dir, "2", f"determinism.mode={mode}")
    if mode == "strict":
        assert second.returncode == 2, second.stderr[-3000:]
        assert "written with 1 torch threads per rank, but this run has 2" in second.stderr
        assert "Traceback" not in second.stderr
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == saved
    else:
        # Fast mode lets the thread change through with a warning; the replay then shows the resumed steps are not
        # the interrupted run's and refuses the resume loudly instead of continuing on another trajectory.
        assert "Continuing because determinism.mode is fast" in second.stderr
        assert second.returncode == 3, second.stderr[-3000:]
        refusal = next(line for line in second.stderr.splitlines() if "the replay of steps 1..3 diverged" in line)
        # The cause is known, so it is named instead of guessed.
        assert "written with 1 torch threads per rank, but this run has 2" in refusal and "Likely cause" not in refusal, refusal
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == saved
