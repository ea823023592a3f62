"""The suite's own hang reports: a world of ranks that never ends fails its test with every hung rank's stacks.

Tests of the test helpers (`conftest.run_ranks`, `helpers.launches.reaped`) with real processes: a planted hang, a
script that sleeps in a function whose name must show up in the failure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import run_ranks
from helpers.launches import reaped, start_ranks

HANGS = """
import sys, time
from pathlib import Path

def hangs_here_forever():
    Path(sys.argv[-1], f"started{__import__('os').environ['RANK']}").touch()
    time.sleep(600)

hangs_here_forever()
"""


def script(tmp_path: Path) -> Path:
    path = tmp_path / "hangs.py"
    path.write_text(HANGS)
    return path


def test_run_ranks_fails_a_hung_world_with_each_ranks_stack(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(AssertionError) as failed:
        run_ranks([sys.executable, str(script(tmp_path)), str(out)], timeout=15)
    message = str(failed.value)
    assert "ranks [0, 1] still ran after 15s" in message
    assert message.count("in hangs_here_forever") == 2, message


def test_reaped_adds_the_stacks_of_ranks_still_running_when_a_test_fails(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(AssertionError) as failed, reaped(start_ranks(script(tmp_path), out)) as procs:
        deadline = time.monotonic() + 60
        while not all((out / f"started{rank}").exists() for rank in range(2)) and time.monotonic() < deadline:
            time.sleep(0.1)
        raise AssertionError("the test's own failure")
    notes = "\n".join(failed.value.__notes__)
    assert notes.count("in hangs_here_forever") == 2, notes
    assert all(p.poll() is not None for p in procs)


def test_reaped_says_so_when_nothing_was_left_running(tmp_path: Path) -> None:
    with pytest.raises(AssertionError) as failed, reaped([]):
        raise AssertionError("the test's own failure")
    assert failed.value.__notes__ == ["no process of the test was still running at the failure"]
