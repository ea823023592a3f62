"""Read what a run directory says about its progress, through the checkpoint manifests (no torch)."""

from __future__ import annotations

from pathlib import Path

from legato.paths import RunPaths
from legato.store.manifest import list_checkpoints, read_manifest_file


def final_manifest(run_dir: Path) -> dict | None:
    """The manifest of the newest published checkpoint that has a readable one, or None."""
    for path in list_checkpoints(RunPaths(run_dir).checkpoints):
        try:
            return read_manifest_file(path)
        except (OSError, ValueError):
            continue
    return None
