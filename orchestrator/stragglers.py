"""Naming a slow rank, and its host, from the ranks' pace files (legato.session.pace): which one waits longer for its
data, or computes its forward longer, than the others, by how much, and how persistently.

Each rank writes the medians of its windows of steps (a few seconds each) on its own; the ranks' windows are compared
in order (the ranks step together, so the i-th window of each covers about the same steps). In a window a rank is
slower when its median is at least SLOWER times the median of the other ranks', at least FLOOR_MS more (a
sub-millisecond forward is noise at any ratio) and more by at least STEP_SHARE of its step (a 2 ms longer data wait
in a 100 ms step costs nothing worth moving a job for, and a busy host's scheduling makes such gaps); a rank is named
when it was slower in at least PERSISTENT of the windows and in MIN_WINDOWS at least, so one hiccup (a checkpoint,
the page cache) names nobody. This module must never write anything.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from legato.files import read_json_lines
from legato.paths import RunPaths

SLOWER = 1.2
FLOOR_MS = 1.0
STEP_SHARE = 0.05
PERSISTENT = 2 / 3
MIN_WINDOWS = 2
MEASURES = {"forward_ms": "forward", "data_ms": "data wait"}


@dataclass(frozen=True)
class Straggler:
    """A rank slower than the others at one measure: its median and theirs over the windows, in how many it was slower."""

    rank: int
    host: str
    measure: str
    ms: float
    others_ms: float
    slower_in: int
    windows: int

    @property
    def label(self) -> str:
        percent = 100 * (self.ms / self.others_ms - 1) if self.others_ms > 0 else float("inf")
        return (
            f"rank {self.rank} on {self.host} is slower: {self.measure} {self.ms:.1f} ms against {self.others_ms:.1f} ms for "
            f"the others (+{percent:.0f}%), in {self.slower_in} of {self.windows} windows"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "label": self.label}


def read_pace(run_dir: Path, job_id: str, attempt: int) -> dict[int, list[dict]]:
    """Each rank's windows of one attempt, in order ({} when it wrote none); a torn last line is left out."""
    folder = RunPaths(run_dir).pace(job_id, attempt, 0).parent
    found: dict[int, list[dict]] = {}
    for path in sorted(folder.glob("rank*.jsonl")) if folder.is_dir() else []:
        rank = int(path.stem.removeprefix("rank")) if path.stem.removeprefix("rank").isdigit() else None
        if rank is None:
            continue
        found[rank] = read_json_lines(path)
    return found


def stragglers(pace: dict[int, list[dict]]) -> list[Straggler]:
    """The ranks persistently slower than the others, at each measure."""
    if len(pace) < 2:
        return []
    windows = min(len(lines) for lines in pace.values())
    named = []
    for key, measure in MEASURES.items():
        for rank, lines in sorted(pace.items()):
            mine: list[float] = []
            theirs: list[float] = []
            slower = 0
            for i in range(windows):
                value = lines[i].get(key)
                others = [v for v in (pace[r][i].get(key) for r in pace if r != rank) if v is not None]
                if value is None or len(others) < len(pace) - 1:
                    continue
                typical = statistics.median(others)
                mine.append(value)
                theirs.append(typical)
                slower += _slower(value, typical, lines[i].get("step_ms"))
            if slower >= MIN_WINDOWS and slower >= PERSISTENT * len(mine):
                host = str(lines[-1].get("host", "?"))
                named.append(Straggler(rank, host, measure, statistics.median(mine), statistics.median(theirs), slower, len(mine)))
    return named


def _slower(value: float, typical: float, step_ms: float | None) -> bool:
    """Whether one window's `value` is slower than the others' `typical` by the module docstring's three measures."""
    excess = value - typical
    return value >= SLOWER * typical and excess >= FLOOR_MS and excess >= STEP_SHARE * (step_ms or 0.0)
