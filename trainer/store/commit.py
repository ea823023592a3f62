"""The commit protocol of a barrier checkpoint, in named phases that both drivers share.

Layout: `<root>/step_<N>/` holds the files of every rank (which rank writes
which file: `legato.store.layout.writes`) and `manifest.json` (step, world
size, per-rank component digests and hashes and the files each rank wrote,
the global hash and an XXH3-128 per file). The phases, in order:

  stage    the temporary directory `<root>/.tmp_step_<N>/`, its paths checked
  write    each rank writes and fsyncs its files there (one hash pass)
  agree    the ranks' reports (digests, file hashes, replay base) meet
  publish  the leader writes and fsyncs the manifest and publishes the
           directory with one atomic rename: a reader sees all or nothing
  prune    the leader removes older temporaries and checkpoints past keep_last
           (not one a kept checkpoint refers to as its replay base)

A rank that cannot write (a full disk, a quota, a read-only or vanished
directory) still reports, with its error: the ranks agree that the checkpoint
failed, the leader removes its temporary directory, and every rank raises
`NotWritten`; the checkpoints before it stand.

The synchronous driver (legato.store.checkpoint) runs them in one collective
call; the asynchronous one (legato.store.async_checkpoint) writes in a worker
thread and agrees through report files and the stop agreement. Kill-points
(`kill_point`) plant SIGKILLs between phases for the fault tests. Nothing
outside `<root>` is read or written. This module must never know the Session,
draw from an RNG, or decide when a checkpoint is due.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from legato.files import fsync_dir, write_fsynced
from legato.paths import CHECKPOINT_MANIFEST as MANIFEST
from legato.paths import STEP_PREFIX, TMP_STEP_PREFIX
from legato.state import recipes
from legato.state.hashing import Digests, global_hash, rank_hash, tensor_rules
from legato.state.recipes import SHARE
from legato.store import bases
from legato.store.filehash import save_all
from legato.store.manifest import FORMAT, check_contained, checkpoint_step, list_checkpoints, manifest_checksum
from legato.store.manifest_schema import CPU_CAPABILITY_KEY, DIVERGED, TENSOR_DIGESTS_KEY

log = logging.getLogger(__name__)

LEADER = 0  # the rank that prepares, publishes and prunes


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
    """A published checkpoint: its step, directory, global hash, how long it took, its size (the bytes it wrote), the ranks
    whose replicated state differed from the copy written for every rank (rank -> tensors; known to the ranks that hold the
    reports), and, for a checkpoint that holds its state as the replay of the steps since an earlier one, that one's step."""

    step: int
    path: Path
    global_hash: str
    seconds: float
    bytes: int
    diverged: dict[int, list[str]] = field(default_factory=dict)
    replays_from: int | None = None


class NotWritten(Exception):
    """A checkpoint that some rank could not write, raised on every rank once they agreed on it, after its partial files
    were removed (by the leader); the checkpoints before it stand. `errors`: each failing rank's OSError, as text."""

    def __init__(self, step: int, errors: dict[int, str], root: Path) -> None:
        self.step, self.errors = step, errors
        # Every rank knows every failing rank's error: the synchronous ranks' reports carry them, the asynchronous ranks
        # exchange them as they abandon the checkpoint, and the leader broadcasts its own.
        detail = "; ".join(f"rank {rank}: {error}" for rank, error in sorted(errors.items()))
        codes = {int(code) for error in errors.values() for code in _ERRNO.findall(error)}
        state, self.fix = _cause(codes, root)
        super().__init__(f"checkpoint step {step} could not be written ({detail}); its partial files are removed, and {state}")


@dataclass(frozen=True)
class KillPoint:
    """Fault injection: die with SIGKILL at this point of this step's checkpoint."""

    step: int
    point: str


def step_dir(root: Path, step: int) -> Path:
    """Where checkpoint `step` is published."""
    return root / f"{STEP_PREFIX}{step}"


def tmp_dir(root: Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is published."""
    return root / f"{TMP_STEP_PREFIX}{step}"


def stage(root: Path, step: int, rank: int, fresh: bool) -> Path:
    """Phase stage: check the paths and create the temporary directory of checkpoint `step`.

    Every rank checks the same paths, so every rank refuses together instead of waiting in a barrier. `fresh`
    (a synchronous checkpoint, followed by a barrier): the leader alone clears what an earlier attempt left.
    Otherwise every rank creates it if missing, as the ranks start writing without waiting for each other: what a killed
    earlier attempt left there is replaced file by file (`write_files`) or removed before the manifest (`publish`).
    """
    tmp = tmp_dir(root, step)
    for path in (root, tmp, step_dir(root, step)):
        check_contained(root, path)
    if not fresh:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(exist_ok=True)
    elif rank == LEADER:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    return tmp


def write_files(directory: Path, files: dict[str, Any], seen: tuple[Digests, ...] = ()) -> dict[str, dict]:
    """Phase write: torch.save each state to `directory/<name>`, fsynced; returns name -> {bytes, hash, segments}."""
    known = {key: d for s in seen for key, d in s.by_storage.items()}
    return dict(zip(files, save_all({directory / name: state for name, state in files.items()}, known)))


def report(
    rank: int, state_hash: str, components: dict[str, str], written: dict[str, dict], replay: dict | None, share: dict | None = None
) -> dict:
    """One rank's report of its written share: what `agree` exchanges and `publish` turns into the manifest. With `share`
    (a staged copy's share of the digests, legato.state.recipes) the digests and hash are left to `complete`."""
    out = {
        "rank": rank,
        "hash": state_hash,
        "components": components,
        "files": written,
        "replay": replay,
        CPU_CAPABILITY_KEY: torch.backends.cpu.get_cpu_capability(),
    }
    return out if share is None else {**out, SHARE: share}


def complete(reports: list[dict]) -> list[dict]:
    """The ranks' reports (in rank order) with the digests and rank hashes that they left to their meeting filled in, for
    the state and for the replay base: every rank's share of the digests completed by the others' (recipes.complete)."""
    if not reports:
        return reports
    reports = _completed(reports)
    if reports[0]["replay"] is None:
        return reports
    replays = _completed([r["replay"] for r in reports])
    return [{**r, "replay": replay} for r, replay in zip(reports, replays)]


def _completed(entries: list[dict]) -> list[dict]:
    if not any(SHARE in e for e in entries):
        return entries
    out = []
    for e, done in zip(entries, recipes.complete([e[SHARE] for e in entries])):
        entry = {**{k: v for k, v in e.items() if k != SHARE}, "components": done.components, "hash": rank_hash(done.components)}
        if done.diverged:
            entry[DIVERGED] = {"tensors": done.diverged, "writers": done.writers}
        out.append(entry)
    return out


def warn_diverged(reports: list[dict]) -> None:
    """Log each rank whose replicated state differed from the writer's copy (the leader calls it: one line a rank, not N)."""
    for rank, entry in enumerate(reports):
        diverged = entry.get(DIVERGED) or (entry["replay"] or {}).get(DIVERGED)
        if diverged is None:
            continue
        log.warning(
            "rank %d's copy of the replicated state differs from the copy written for every rank by rank %s (tensors %s): its "
            "own values were not saved, so a resume from this state will fail its verification on rank %d",
            rank,
            ", ".join(map(str, diverged["writers"])),
            ", ".join(diverged["tensors"][:6]),
            rank,
        )


def agree(own: dict, world_size: int, group: dist.ProcessGroup | None) -> list[dict]:
    """Phase agree (collective): every rank's report, in rank order."""
    if group is None:
        return [own]
    reports: list[Any] = [None] * world_size
    dist.all_gather_object(reports, own, group=group)
    return sorted(reports, key=lambda r: r["rank"])


def combined_hash(reports: list[dict]) -> str:
    """The global hash of the ranks' reports; empty where this rank holds none (an asynchronous follower)."""
    return global_hash([r["hash"] for r in reports]) if reports else ""


def publish(root: Path, tmp: Path, step: int, world_size: int, reports: list[dict], ghash: str, meta: dict, kill: KillPoint | None) -> None:
    """Phase publish (the leader): remove what no report lists, write and fsync the manifest, then rename `tmp` into
    place atomically."""
    _clear_unlisted(tmp, reports)
    manifest = {
        "format": FORMAT,
        "step": step,
        "world_size": world_size,
        "torch_version": torch.__version__,
        "global_hash": ghash,
        TENSOR_DIGESTS_KEY: tensor_rules(),
        # Who wrote what: a rank's missing file names the rank whose share is lost.
        "ranks": [_rank_entry(r) for r in reports],
        "files": {name: info for r in reports for name, info in r["files"].items()},
        "created_unix": time.time(),
        **meta,
    }
    if reports[0]["replay"] is not None:
        manifest["replay"] = bases.section(root, reports)
    manifest["manifest_sha256"] = manifest_checksum(manifest)
    write_fsynced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    kill_point(kill, step, "after_manifest")
    fsync_dir(tmp)
    kill_point(kill, step, "before_publish")
    final = step_dir(root, step)
    if final.exists():
        # A newer timeline reached this step again after falling back past it.
        stale = root / f".stale_{STEP_PREFIX}{step}"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        shutil.rmtree(stale)
    os.replace(tmp, final)
    fsync_dir(root)


def _rank_entry(report: dict) -> dict:
    entry = {
        "rank": report["rank"],
        "hash": report["hash"],
        "components": report["components"],
        "wrote": sorted(report["files"]),
        CPU_CAPABILITY_KEY: report[CPU_CAPABILITY_KEY],
    }
    return {**entry, DIVERGED: report[DIVERGED]} if DIVERGED in report else entry


def _clear_unlisted(tmp: Path, reports: list[dict]) -> None:
    """Remove every entry of `tmp` that no rank reported: report files, and what a killed earlier attempt at this step left."""
    listed = {name for r in reports for name in r["files"]}
    for entry in tmp.iterdir():
        if entry.name in listed:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prune(root: Path, keep_last: int, keep: int) -> None:
    """Phase prune (the leader), after publishing step `keep`: remove temporary directories of earlier steps
    and all but the `keep_last` newest checkpoints up to `keep`, except those a kept one refers to as its replay base.

    Directories past `keep` are neither counted nor removed: a temporary one may be the next asynchronous
    checkpoint, which another rank already writes; a published one is of a timeline this run fell back from
    (it did not verify), and the run replaces each when it gets there.
    """
    for stale in root.glob(f"{TMP_STEP_PREFIX}*"):
        suffix = stale.name[len(TMP_STEP_PREFIX) :]
        if not suffix.isdigit() or int(suffix) < keep:
            shutil.rmtree(stale, ignore_errors=True)
    upto = [p for p in list_checkpoints(root) if checkpoint_step(p) <= keep]
    bases_kept = bases.referenced(upto[:keep_last])
    for old in upto[keep_last:]:
        if old.name not in bases_kept:
            shutil.rmtree(old, ignore_errors=True)


def committed(root: Path, step: int, reports: list[dict], ghash: str, seconds: float) -> Committed:
    """What a driver returns once checkpoint `step` is published."""
    total = sum(f["bytes"] for r in reports for f in r["files"].values())
    diverged = {r["rank"]: sorted({t for e in (r, r["replay"] or {}) for t in e.get(DIVERGED, {}).get("tensors", [])}) for r in reports}
    return Committed(step, step_dir(root, step), ghash, seconds, total, {rank: t for rank, t in diverged.items() if t})


def write_error(exc: BaseException) -> OSError | None:
    """The OSError under `exc`, where writing failed for a reason outside the program (torch.save reports a failed write
    as a RuntimeError raised while handling it); None for anything else, which is a bug to raise as it is."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def failed(rank: int, error: OSError) -> dict:
    """A rank's report of a write that failed: what `agree` exchanges instead of its files."""
    return {"rank": rank, "failure": str(error)}


def check_written(root: Path, tmp: Path, step: int, reports: list[dict], rank: int) -> None:
    """After `agree`: raise NotWritten on every rank when a report says its write failed (the leader removes `tmp` first)."""
    errors = {r["rank"]: r["failure"] for r in reports if "failure" in r}
    if not errors:
        return
    if rank == LEADER:
        shutil.rmtree(tmp, ignore_errors=True)
    raise NotWritten(step, errors, root)


def publish_or_remove(
    root: Path, tmp: Path, step: int, world_size: int, reports: list[dict], ghash: str, meta: dict, kill: KillPoint | None
) -> str | None:
    """The leader's `publish`; when it fails before the rename, `tmp` is removed and the error returned as text."""
    try:
        publish(root, tmp, step, world_size, reports, ghash, meta, kill)
    except OSError as exc:
        if step_dir(root, step).is_dir() and not tmp.exists():
            log.warning("checkpoint step %d is published, but making it durable failed: %s", step, exc)
            return None
        shutil.rmtree(tmp, ignore_errors=True)
        return str(exc)
    return None


def leader_outcome(root: Path, step: int, error: str | None, group: dist.ProcessGroup | None) -> None:
    """Collective, in place of the last barrier: rank 0's publish error reaches every rank, which raises NotWritten."""
    if group is not None:
        box = [error]
        dist.broadcast_object_list(box, src=LEADER, group=group)
        error = box[0]
    if error is not None:
        raise NotWritten(step, {LEADER: error}, root)


_ERRNO = re.compile(r"\[Errno (\d+)\]")  # how an OSError's text starts, whichever rank it came from


def _cause(codes: set[int], root: Path) -> tuple[str, str]:
    """What the failed writes' error codes say of the checkpoints' filesystem, and the fix, in words. A filesystem that
    is read-only or that this user may not write to is named as such: "free space" would send a user the wrong way."""
    if errno.EROFS in codes:
        return "the checkpoints' filesystem is read-only", "remount it writable (or move the run directory to one that is)"
    if codes & {errno.EACCES, errno.EPERM}:
        return "this user may not write in the checkpoints' directory", "make the run directory writable by this user"
    return f"{_free(root)} on the checkpoints' filesystem", "free space (or raise the quota)"


def _free(root: Path) -> str:
    """How much room the filesystem of `root` has left, in words."""
    try:
        usage = shutil.disk_usage(root)
    except OSError:
        return "the free space unknown"
    return f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB"


def barrier(group: dist.ProcessGroup | None) -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if group is not None:
        dist.barrier(group=group)


def kill_point(kill: KillPoint | None, step: int, point: str) -> None:
    """Fault injection: SIGKILL this process when `kill` names this point of this step's checkpoint."""
    if kill is not None and kill.step == step and kill.point == point:
        log.warning("chaos: SIGKILL at %s of checkpoint step %d", point, step)
        os.kill(os.getpid(), signal.SIGKILL)
