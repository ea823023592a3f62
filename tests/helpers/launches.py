"""Watching a launch from outside, as a scheduler would: how far its rank 0 trained, and every process under it."""

from __future__ import annotations

from pathlib import Path

from legato.runtime.processes import children


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
