"""Barrier checkpoints: one commit protocol for signal-driven and periodic saves.

Layout: `<root>/step_<N>/` holds `model.pt` and `train_state.pt` (replicated,
written by rank 0), `rank<R>.pt` (each rank's own state) and `manifest.json`
(step, world size, per-rank component digests and hashes, the global hash and
an XXH3-128 per file). Protocol: rank 0 prepares `<root>/.tmp_step_<N>/`; every
rank writes and fsyncs its files there; the ranks exchange their digests; rank
0 writes and fsyncs the manifest and publishes the directory with one atomic
rename. A reader therefore sees a complete checkpoint or none.

One hash pass: a file's hash is XXH3-128 over its regions, where the big
regions are the tensor storages torch.save streams from the very memory the
state digests were computed on; the writer takes those digests instead of
hashing the bytes again, and the manifest lists the regions (`segments`) so
that a reader checks the file from its bytes alone (legato.store.manifest). torch's
own zip CRC32 is switched off for the same reason: the file hash covers it.

Loading uses `torch.load(weights_only=True)` only: nothing in a checkpoint is
ever unpickled. Selection picks the newest checkpoint whose manifest and files
verify, warning about each one it skips. Nothing outside `<root>` is read or
written: a symlink where a checkpoint directory or file belongs, a manifest
naming a path outside its directory or one of absurd size is refused.
"""

from __future__ import annotations

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

import numpy as np
import torch
import torch.distributed as dist
import xxhash
from torch.utils.serialization import config as serialization_config

from legato.files import fsync_dir, write_fsynced
from legato.paths import CHECKPOINT_MANIFEST as MANIFEST
from legato.paths import STEP_PREFIX
from legato.paths import TMP_STEP_PREFIX as TMP_PREFIX
from legato.state.hashing import Digests, global_hash
from legato.store.manifest import FORMAT, HASH_KEY, check_contained, checkpoint_step, list_checkpoints, manifest_checksum, region_record

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RankShare:
    """What one rank contributes to a checkpoint."""

    rank: int
    files: dict[str, Any]  # file name -> plain state to torch.save
    components: dict[str, str]  # component name -> digest
    hash: str
    replay: dict | None = None  # the replay base: its step, digests and the records of the steps since
    seen: tuple[Digests, ...] = ()  # the tensor digests already computed over the memory of `files`


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
    written = write_files(tmp, share.files, share.seen)
    report = {"rank": share.rank, "hash": share.hash, "components": share.components, "files": written, "replay": share.replay}
    reports = _gather_reports(report, world_size, group)
    _maybe_kill(kill, step, "after_shards")
    committed_hash = global_hash([r["hash"] for r in reports])
    if share.rank == 0:
        _publish(root, tmp, step, world_size, reports, committed_hash, meta, kill)
        _prune(root, keep_last, keep=step)
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
    if reports[0]["replay"] is not None:
        manifest["replay"] = {"from_step": reports[0]["replay"]["from_step"], "ranks": [r["replay"] for r in reports]}
    manifest["manifest_sha256"] = manifest_checksum(manifest)
    write_fsynced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    _maybe_kill(kill, step, "after_manifest")
    fsync_dir(tmp)
    _maybe_kill(kill, step, "before_publish")
    final = step_dir(root, step)
    if final.exists():
        # A newer timeline reached this step again after falling back past it.
        stale = root / f".stale_{STEP_PREFIX}{step}"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        shutil.rmtree(stale)
    os.replace(tmp, final)
    fsync_dir(root)


SEGMENT_MIN_BYTES = 4096  # smaller writes are hashed as part of the region around them


class _HashingWriter:
    """A file that hashes what passes through it, so torch.save streams to disk in one pass.

    A write whose buffer is a storage with a known digest becomes a segment of its own (its digest is
    reused, its bytes not hashed again); everything between segments is hashed as one region.
    """

    def __init__(self, f: io.BufferedWriter, known: dict[tuple[int, int], bytes]) -> None:
        self._f = f
        self._known = known
        self._combined = xxhash.xxh3_128()
        self._region = xxhash.xxh3_128()
        self._region_bytes = 0
        self.segments: list[list[int]] = []
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        found = self._known.get((_address(view), view.nbytes)) if view.nbytes >= SEGMENT_MIN_BYTES else None
        if found is None:
            self._region.update(view)
            self._region_bytes += view.nbytes
        else:
            self._close_region()
            self._combined.update(region_record("S", view.nbytes, found))
            self.segments.append([self.bytes, view.nbytes])
        self.bytes += view.nbytes
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        self._close_region()
        return self._combined.hexdigest()

    def _close_region(self) -> None:
        self._combined.update(region_record("G", self._region_bytes, self._region.digest()))
        self._region = xxhash.xxh3_128()
        self._region_bytes = 0


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0] if view.nbytes else 0


def write_files(directory: Path, files: dict[str, Any], seen: tuple[Digests, ...] = ()) -> dict[str, dict]:
    """torch.save each state to `directory/<name>`, fsynced; returns name -> {bytes, hash, segments}."""
    known = {key: d for s in seen for key, d in s.by_storage.items()}
    return {name: _save_fsynced(state, directory / name, known) for name, state in files.items()}


def _save_fsynced(state: Any, path: Path, known: dict[tuple[int, int], bytes]) -> dict:
    with open(path, "wb") as f:
        writer = _HashingWriter(f, known)
        with serialization_config.patch({"save.compute_crc32": False}):
            torch.save(state, writer)
        f.flush()
        os.fsync(f.fileno())
    return {HASH_KEY: writer.hexdigest(), "bytes": writer.bytes, "segments": writer.segments}


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


def _prune(root: Path, keep_last: int, keep: int) -> None:
    """After publishing step `keep`: remove temporary directories of earlier steps and all but the `keep_last`
    newest checkpoints up to `keep`. Directories past `keep` are neither counted nor removed: a temporary one
    may be the next asynchronous checkpoint, which another rank already writes; a published one is of a
    timeline this run fell back from (it did not verify), and the run replaces each when it gets there."""
    for stale in root.glob(f"{TMP_PREFIX}*"):
        suffix = stale.name[len(TMP_PREFIX):]
        if not suffix.isdigit() or int(suffix) < keep:
            shutil.rmtree(stale, ignore_errors=True)
    upto = [p for p in list_checkpoints(root) if checkpoint_step(p) <= keep]
    for old in upto[keep_last:]:
        shutil.rmtree(old, ignore_errors=True)


def load_file(path: Path) -> Any:
    """Load one checkpoint file as plain data; never unpickles arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)
