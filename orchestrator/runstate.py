"""Read what a run directory says about its progress, through the checkpoint file format."""

from __future__ import annotations

import json
from pathlib import Path

from legato.checkpoint import MANIFEST, list_checkpoints


def final_manifest(run_dir: Path) -> dict | None:
    """The manifest of the newest published checkpoint that has a readable one, or None."""
    for path in list_checkpoints(run_dir / "checkpoints"):
        try:
            return json.loads((path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return None
