"""torchrun launches of a ported loop (examples/port/nanogpt_legato.py): real torchrun, 2 ranks, gloo, real SIGUSR2.

One launch per attempt through `python -m legato.torchrun`: a stop at a
checkpoint is exit 75 (plain torchrun says exit 1 and a ChildFailedError),
the next launch resumes, and the run ends bit for bit where an uninterrupted
one ends. In-place restarts (`--max-restarts`) are not tested: here the
restarted gloo workers failed to connect in 2 of 3 tries (see the README).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_port import assert_same_run

from legato.launch import free_port

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "examples" / "port" / "nanogpt_legato.py"
STEPS = 25


def torchrun(out: Path, *launcher: str, signal_at: str = "") -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", LEGATO_CHAOS_SIGNAL_AT=signal_at, LEGATO_CHAOS_SIGNAL_RANK="1")
    cmd = [*launcher, "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT), str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


LEGATO_TORCHRUN = (sys.executable, "-m", "legato.torchrun", "--max-restarts", "0")


def test_one_torchrun_launch_per_attempt_exits_75_then_resumes_exactly(tmp_path: Path) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert torchrun(reference, *LEGATO_TORCHRUN).returncode == 0
    stopped = torchrun(resumed, *LEGATO_TORCHRUN, signal_at="5")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "legato: every rank stopped at a committed checkpoint (exit 75)" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    last = torchrun(resumed, *LEGATO_TORCHRUN, signal_at="5")
    assert last.returncode == 0, last.stderr[-3000:]
    assert "legato: rank 0: resumed at step 6 " in last.stderr and "verified" in last.stderr
    assert_same_run(reference, resumed, STEPS)

