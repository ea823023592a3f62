"""The quiet boundary at two ranks under DDP (tests/unit/test_quiet_boundary.py has one rank): a run stopped by a signal
to one rank and resumed leaves the same trajectories, checkpoints, replay bases and stop step whether or not its
boundaries may be quiet, and no quiet boundary falls where the agreement checks or something is due."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks, trajectory

from legato.store.manifest import list_checkpoints

SCRIPT = ROOT / "tests" / "helpers" / "quiet_ddp.py"
STOP_AFTER, TOTAL = 17, 30


def _run(run_dir: Path, **env: str) -> dict:
    stopped = run_ranks([sys.executable, str(SCRIPT), str(run_dir)], STOP_AFTER=str(STOP_AFTER), **env)
    assert codes(stopped) == [75, 75], [p.stderr[-2000:] for p in stopped]
    finished = run_ranks([sys.executable, str(SCRIPT), str(run_dir)], **env)
    assert codes(finished) == [0, 0], [p.stderr[-2000:] for p in finished]
    manifests = [json.loads((d / "manifest.json").read_text()) for d in list_checkpoints(run_dir / "checkpoints")]
    return {
        "trajectories": [trajectory(run_dir, rank) for rank in (0, 1)],
        "checkpoints": [(m["step"], m["reason"], m["global_hash"], (m.get("replay") or {}).get("from_step")) for m in manifests],
    }


def _quiet(run_dir: Path, rank: int) -> list[tuple[int, int]]:
    path = run_dir / f"quiet-rank{rank}.txt"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] if path.exists() else []  # type: ignore[misc]


@pytest.mark.slow
def test_two_ranks_with_quiet_boundaries_leave_the_bits_of_two_without(tmp_path: Path) -> None:
    quiet = _run(tmp_path / "quiet")
    loud = _run(tmp_path / "loud", ALL_LOUD="1")
    stops = [c for c in quiet["checkpoints"] if c[1] == "signal"]
    assert len(stops) == 1 and stops[0][0] > STOP_AFTER, quiet["checkpoints"]
    due = {n * k for n in (7, 5, 3) for k in range(1, TOTAL // n + 1)} | {TOTAL}
    for rank in (0, 1):
        seen = _quiet(tmp_path / "quiet", rank)
        assert len(seen) > 5, f"rank {rank}: too few quiet boundaries to compare ({seen})"
        assert not {step for step, _ in seen} & due, f"rank {rank}: a boundary with something due was quiet"
        assert all(step < check for step, check in seen), f"rank {rank}: a quiet boundary at the agreement's check: {seen}"
        assert not _quiet(tmp_path / "loud", rank)
    assert quiet == loud
