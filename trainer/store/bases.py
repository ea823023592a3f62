"""Replay bases on disk: each base state is written once, and later checkpoints refer to it.

A checkpoint at step N whose replay base B is not yet on disk writes B under
the `replay_` prefix next to its own files. When B is already on disk (the
own files of checkpoint B, or the `replay_` files of an earlier checkpoint),
the checkpoint writes nothing for it: its manifest's `replay.base` names that
directory, the prefix and the files with their hashes (copied from that
checkpoint's manifest), so a reader verifies them as it verifies its own.
Pruning keeps a checkpoint while a kept one refers to it. A manifest without
`replay.base` holds its base itself (the format before this module). A
manifest with `state_by_replay: true` (a stop checkpoint) holds its base only,
not the state at its own step: a resume must restore the base and replay.

Reads only JSON and file bytes, never imports torch. This module must never
decide which base a checkpoint has (legato.session.saving does) and never write files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from legato.errors import UsageError
from legato.paths import STEP_PREFIX
from legato.store.manifest import Verifier, check_contained, read_manifest_file, verify_listed
from legato.store.manifest_schema import BY_REPLAY

log = logging.getLogger(__name__)

REPLAY_PREFIX = "replay_"
AT_KEY = "base_at"  # in a rank's replay share: [directory, prefix] of a base already on disk


def held_by_replay(manifest: dict) -> bool:
    """Whether checkpoint `manifest` holds its state at its step only as its replay base and the steps since (no files of its own)."""
    return manifest.get(BY_REPLAY) is True


def location(path: Path, manifest: dict) -> tuple[Path, str]:
    """The directory and file-name prefix holding the replay base of checkpoint `path`."""
    base = manifest["replay"].get("base")
    if base is None:
        return path, REPLAY_PREFIX
    return path.parent / base["dir"], base["prefix"]


def section(root: Path, reports: list[dict]) -> dict:
    """The manifest's `replay` section from the ranks' reports; a base on disk is listed with its files' hashes."""
    ranks = [{k: v for k, v in r["replay"].items() if k != AT_KEY} for r in reports]
    out = {"from_step": reports[0]["replay"]["from_step"], "ranks": ranks}
    at = reports[0]["replay"].get(AT_KEY)
    if at is not None:
        directory, prefix = at
        out["base"] = {"dir": directory, "prefix": prefix, "files": listing(root / directory, prefix)}
    return out


def listing(directory: Path, prefix: str) -> dict[str, dict]:
    """The files (name -> hash info) of the state under `prefix` in checkpoint `directory`, from its manifest."""
    files = read_manifest_file(directory)["files"]
    if prefix:
        return {name: info for name, info in files.items() if name.startswith(prefix)}
    return {name: info for name, info in files.items() if not name.startswith(REPLAY_PREFIX)}


def referenced(paths: Iterable[Path]) -> set[str]:
    """The directory names that the checkpoints `paths` refer to as their replay base (kept from pruning)."""
    names = set()
    for path in paths:
        try:
            base = read_manifest_file(path).get("replay", {}).get("base")
        except (ValueError, OSError, AttributeError):
            continue  # unreadable: it refers to nothing we could keep for it
        if isinstance(base, dict) and isinstance(base.get("dir"), str):
            names.add(base["dir"])
    return names


def problem(path: Path, manifest: dict, verify: Verifier | None = None) -> str | None:
    """Why the replay base of checkpoint `path` is unusable (the ranks' bases of different steps; gone, altered or outside),
    or None when its files verify (with `verify`, `verify_listed` by default)."""
    split = _split_steps(manifest.get("replay", {}))
    if split:
        return split
    base = manifest.get("replay", {}).get("base")
    if base is None:
        return None
    name = base.get("dir") if isinstance(base, dict) else None
    if not isinstance(name, str) or "/" in name or not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX) :].isdigit():
        return f"its replay base names {name!r}, which is not a checkpoint directory"
    directory = path.parent / name
    try:
        check_contained(path.parent, directory)
        (verify or verify_listed)(directory, base["files"])
    except (UsageError, ValueError, KeyError, TypeError, OSError) as exc:
        return f"its replay base in {directory} is unusable: {exc}"
    return None


def _split_steps(replay: dict) -> str | None:
    """The ranks' bases were taken at different steps: no one state to replay from (their snapshots were not agreed)."""
    steps = {r.get("rank"): r.get("from_step") for r in replay.get("ranks", []) if isinstance(r, dict)}
    if len(set(steps.values())) <= 1:
        return None
    shown = ", ".join(f"rank {rank}: step {step}" for rank, step in steps.items())
    return (
        f"its ranks' replay bases are of different steps ({shown}), so no replay starts from one state; the ranks took "
        "their replay bases without agreeing on the step"
    )
