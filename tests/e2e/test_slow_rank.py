"""A slow rank named: two real ranks of the DDP-tutorial loop of hang_loop.py, rank 1's forward pass slowed by a
planted sleep (a slower host), and `legato status` names rank 1 and its host, by how much, in how many windows; the
same loop with no slow rank names nobody (the planted fault's control). Under DDP both ranks' steps take equally long
(the all-reduce waits for the slow one), so the naming rests on each rank's own forward time
(legato.session.pace). The rule's arithmetic is tests/unit/test_stragglers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import legato, status
from helpers.launches import ROOT, reaped, start_ranks, stderr_tails

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "hang_loop.py"
# 0.1 s steps for 12 s: two full windows of pace and the attempt's last.
LOOP = {"STEPS": "120", "STEP_SLEEP_S": "0.06"}


def launch(run: Path, **env: str) -> None:
    with reaped(start_ranks(SCRIPT, run, 2, **LOOP, **env)) as procs:
        assert [p.wait(timeout=300) for p in procs] == [0, 0], stderr_tails(run)


def test_a_rank_with_a_slower_forward_is_named_and_an_even_run_names_nobody(tmp_path: Path) -> None:
    slow, even = tmp_path / "slow", tmp_path / "even"
    launch(slow, SLOW_RANK="1", SLOW_FORWARD_S="0.04")
    launch(even)

    (named,) = status(slow)["attempts"][0]["stragglers"]
    assert (named["rank"], named["measure"]) == (1, "forward"), named
    assert named["ms"] >= 40 and named["others_ms"] < 40 and named["slower_in"] == named["windows"] >= 2, named
    table = legato("status", str(slow)).stdout
    assert "attempt 1: rank 1 on " in table and "is slower: forward" in table, table
    assert status(even)["attempts"][0]["stragglers"] == []
