"""Read what a run directory says about its progress: checkpoints and trajectories, as plain data."""

from __future__ import annotations

import json
from pathlib import Path


def final_manifest(run_dir: Path) -> dict | None:
    """The manifest of the newest published checkpoint, or None."""
    root = run_dir / "checkpoints"
    steps = sorted((int(p.name[5:]), p) for p in root.glob("step_*") if p.name[5:].isdigit())
    for _, path in reversed(steps):
        try:
            return json.loads((path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return None
