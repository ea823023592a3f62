"""Barrier checkpoints: one commit protocol for signal-driven and periodic saves.

Layout: `<root>/step_<N>/` holds `model.pt` and `train_state.pt` (replicated,
written by rank 0), `rank<R>.pt` (each rank's own state) and `manifest.json`
(step, world size, per-rank component digests and hashes, the global hash and
a SHA-256 per file). Protocol: rank 0 prepares `<root>/.tmp_step_<N>/`; every
rank writes and fsyncs its files there; the ranks exchange their digests; rank
0 writes and fsyncs the manifest and publishes the directory with one atomic
rename. A reader therefore sees a complete checkpoint or none.

Loading uses `torch.load(weights_only=True)` only: nothing in a checkpoint is
ever unpickled. Selection picks the newest checkpoint whose manifest and files
verify, warning about each one it skips. Nothing outside `<root>` is read or
written: a symlink where a checkpoint directory or file belongs, a manifest
naming a path outside its directory or one of absurd size is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from legato.errors import UsageError
from legato.hashing import global_hash

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp_step_"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class RankShare:
    """What one rank contributes to a checkpoint."""

    rank: int
    files: dict[str, Any]  # file name -> plain state to torch.save
    components: dict[str, str]  # component name -> digest
    hash: str


@dataclass(frozen=True)
class Committed:
    step: int
    path: Path
    global_hash: str
    seconds: float
    bytes: int


@dataclass(frozen=True)
class KillPoint:
    """Fault injection: die with SIGKILL at this point of this step's checkpoint."""

    step: int
    point: str


def step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step}"


def write_checkpoint(
    root: Path,
    step: int,
    share: RankShare,
    world_size: int,
    group: dist.ProcessGroup | None,
    meta: dict[str, Any],
    keep_last: int,
    kill: KillPoint | None = None,
) -> Committed:
    """Collective: every rank calls this with its share; returns once the checkpoint is published."""
    start = time.perf_counter()
    tmp = root / f"{TMP_PREFIX}{step}"
    # Every rank checks the same paths, so every rank refuses together instead of waiting in a barrier.
    for path in (root, tmp, step_dir(root, step)):
        check_contained(root, path)
    if share.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier(group)
    written = {name: _save_fsynced(state, tmp / name) for name, state in share.files.items()}
    report = {"rank": share.rank, "hash": share.hash, "components": share.components, "files": written}
    reports = _gather_reports(report, world_size, group)
    _maybe_kill(kill, step, "after_shards")
    committed_hash = global_hash([r["hash"] for r in reports])
    if share.rank == 0:
        _publish(root, tmp, step, world_size, reports, committed_hash, meta, kill)
        _prune(root, keep_last)
    _barrier(group)
    total = sum(f["bytes"] for r in reports for f in r["files"].values())
    return Committed(step, step_dir(root, step), committed_hash, time.perf_counter() - start, total)


def _publish(root: Path, tmp: Path, step: int, world_size: int, reports: list[dict], ghash: str, meta: dict, kill: KillPoint | None) -> None:
    manifest = {
        "format": FORMAT,
        "step": step,
        "world_size": world_size,
        "torch_version": torch.__version__,
        "global_hash": ghash,
        "ranks": [{"rank": r["rank"], "hash": r["hash"], "components": r["components"]} for r in reports],
        "files": {name: info for r in reports for name, info in r["files"].items()},
        "created_unix": time.time(),
        **meta,
    }
    manifest["manifest_sha256"] = _manifest_checksum(manifest)
    _write_fsynced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    _maybe_kill(kill, step, "after_manifest")
    _fsync_dir(tmp)
    _maybe_kill(kill, step, "before_publish")
    final = step_dir(root, step)
    if final.exists():
        # A newer timeline reached this step again after falling back past it.
        stale = root / f".stale_{STEP_PREFIX}{step}"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        shutil.rmtree(stale)
    os.replace(tmp, final)
    _fsync_dir(root)


class _HashingWriter:
    """A file that hashes what passes through it, so torch.save streams to disk in one pass."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def _manifest_checksum(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON without this field: a flipped digit must not pass."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _save_fsynced(state: Any, path: Path) -> dict:
    with open(path, "wb") as f:
        writer = _HashingWriter(f)
        torch.save(state, writer)
        f.flush()
        os.fsync(f.fileno())
    return {"sha256": writer.sha256.hexdigest(), "bytes": writer.bytes}


def _write_fsynced(path: Path, data: bytes | memoryview) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _gather_reports(report: dict, world_size: int, group: dist.ProcessGroup | None) -> list[dict]:
    if group is None:
        return [report]
    reports: list[Any] = [None] * world_size
    dist.all_gather_object(reports, report, group=group)
    return sorted(reports, key=lambda r: r["rank"])


def _barrier(group: dist.ProcessGroup | None) -> None:
    if group is not None:
        dist.barrier(group=group)


def _maybe_kill(kill: KillPoint | None, step: int, point: str) -> None:
    if kill is not None and kill.step == step and kill.point == point:
        log.warning("chaos: SIGKILL at %s of checkpoint step %d", point, step)
        os.kill(os.getpid(), signal.SIGKILL)


def _prune(root: Path, keep_last: int) -> None:
    for stale in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(root)[keep_last:]:
        shutil.rmtree(old, ignore_errors=True)


def check_contained(root: Path, path: Path) -> None:
    """Refuse (UsageError) a checkpoint path that is a symlink or leads outside the run directory: nothing is written through it.

    `root` itself (`<run_dir>/checkpoints`) may be a link within the run directory; anything under it may not be a link at all.
    """
    if not os.path.lexists(path):
        return
    if path == root:
        outside = not path.resolve().is_relative_to(root.parent.resolve())
    else:
        outside = path.is_symlink() or not path.resolve().is_relative_to(root.resolve())
    if outside:
        raise UsageError(
            f"{path} is a symlink (to {path.resolve()}); legato reads and writes checkpoints only inside the run directory "
            f"{root.parent}, never through a link. Remove the link (`rm {path}`) and run again."
        )


def check_tree(root: Path) -> None:
    """Before a run starts: refuse a checkpoint directory holding a link, wherever it points."""
    check_contained(root, root)
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((STEP_PREFIX, TMP_PREFIX)):
            check_contained(root, entry)
            if entry.is_dir():
                for inner in sorted(entry.iterdir()):
                    check_contained(root, inner)


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories, newest step first."""
    found = []
    for path in root.glob(f"{STEP_PREFIX}*"):
        suffix = path.name[len(STEP_PREFIX):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return [p for _, p in sorted(found, reverse=True)]


def read_manifest(path: Path) -> dict:
    """The manifest of checkpoint directory `path`, after verifying every file it lists.

    Raises ValueError naming what is wrong.
    """
    if path.is_symlink() or (path / MANIFEST).is_symlink():
        raise ValueError("it is a symlink (legato reads nothing outside the run directory)")
    try:
        if (path / MANIFEST).stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest.json is larger than {MAX_MANIFEST_BYTES // 2**20} MiB (not written by legato)")
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError("no manifest.json (incomplete checkpoint)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"manifest.json is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"manifest.json is not a legato checkpoint manifest of format {FORMAT}")
    if manifest.get("manifest_sha256") != _manifest_checksum(manifest):
        raise ValueError("manifest.json does not match its own checksum (corrupt)")
    for name, info in manifest["files"].items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\x00" in name:
            raise ValueError(f"manifest.json names the file {name!r}, which is not a plain name inside the checkpoint")
        _verify_file(path / name, info)
    return manifest


def _verify_file(path: Path, info: dict) -> None:
    if path.is_symlink():
        raise ValueError(f"{path.name} is a symlink (legato reads nothing outside the run directory)")
    if not path.is_file():
        raise ValueError(f"{path.name} is missing")
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    if size != info["bytes"] or h.hexdigest() != info["sha256"]:
        raise ValueError(f"{path.name} does not match its SHA-256 in the manifest (corrupt or truncated)")


def newest_valid(root: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint whose manifest and files verify; each skipped one is named in a warning."""
    for path in list_checkpoints(root):
        try:
            return path, read_manifest(path)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping checkpoint %s: %s", path, exc)
    return None


def check_compatible(manifest: dict, path: Path, world_size: int, training: dict) -> None:
    """Raise a UsageError when checkpoint `path` cannot continue this run bit for bit."""
    if manifest["world_size"] != world_size:
        raise UsageError(
            f"Checkpoint {path} was written by {manifest['world_size']} ranks, but this run has {world_size}. "
            "Bitwise continuation needs the same world size (it fixes the reduction order): run with "
            f"{manifest['world_size']} ranks, or use a new run directory to start over."
        )
    if manifest["torch_version"] != torch.__version__:
        raise UsageError(
            f"Checkpoint {path} was written with torch {manifest['torch_version']}, this is torch {torch.__version__}. "
            "RNG state layouts and kernels differ between versions; resume with the torch that wrote it, or start a new run directory."
        )
    saved = manifest.get("training")
    if saved is not None and saved != training:
        keys = sorted(_diff_keys(saved, training))
        raise UsageError(
            f"Run directory {path.parent.parent} belongs to another training config: {', '.join(keys)} differ from "
            "the checkpoint. Use the config that started this run, or a new run.dir."
        )


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def load_file(path: Path) -> Any:
    """Load one checkpoint file as plain data; never unpickles arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)
