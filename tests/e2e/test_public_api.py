"""The public API in a user's own loop (examples/own_loop.py), launched like srun would: one process per rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, assert_bitwise_equal, run_ranks

EXAMPLE = ROOT / "examples" / "own_loop.py"


def launch(run_dir: Path, *args: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(EXAMPLE), str(run_dir), *args], timeout=120, PYTHONPATH=str(ROOT))


@pytest.mark.slow
def test_own_loop_resumes_bitwise(tmp_path: Path) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert [p.returncode for p in launch(reference)] == [0, 0]
    assert [p.returncode for p in launch(resumed, "--signal-at", "13", "--signal-at", "26")] == [75, 75]
    second = launch(resumed, "--signal-at", "13", "--signal-at", "26")
    assert [p.returncode for p in second] == [75, 75]
    assert "resumed at step" in second[0].stderr and "verified" in second[0].stderr
    assert [p.returncode for p in launch(resumed)] == [0, 0]
    assert_bitwise_equal(reference, resumed, 40)
