"""The synchronous checkpoint driver: every rank runs the commit protocol's phases in one collective call.

Used for stop and final checkpoints, and for periodic ones when they are not
written in the background. The phases themselves (stage, write, agree,
publish, prune) and the on-disk layout are legato.store.commit's; this module
only orders them with the barriers a synchronous save needs. It must never
know the Session, and never call the asynchronous driver.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from legato.store import commit
from legato.store.commit import Committed, KillPoint, RankShare

__all__ = ["Committed", "KillPoint", "RankShare", "write_checkpoint"]

log = logging.getLogger(__name__)


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
    """Collective: every rank calls this with its share; returns once the checkpoint is published, or raises
    `commit.NotWritten` on every rank when a rank could not write (its partial files removed, the older checkpoints kept)."""
    start = time.perf_counter()
    own = _write(root, step, share, group)
    reports = commit.agree(own, world_size, group)
    commit.check_written(root, commit.tmp_dir(root, step), step, reports, share.rank)
    reports = commit.complete(reports)
    commit.kill_point(kill, step, "after_shards")
    ghash = commit.combined_hash(reports)
    error = None
    if share.rank == commit.LEADER:
        commit.warn_diverged(reports)
        error = commit.publish_or_remove(root, commit.tmp_dir(root, step), step, world_size, reports, ghash, meta, kill)
        if error is None:
            commit.prune(root, keep_last, keep=step)
    commit.leader_outcome(root, step, error, group)
    return commit.committed(root, step, reports, ghash, time.perf_counter() - start)


def _write(root: Path, step: int, share: RankShare, group: dist.ProcessGroup | None) -> dict:
    """Phases stage and write: this rank's report, or its error where the filesystem refused (the ranks then agree on it)."""
    error = None
    try:
        tmp = commit.stage(root, step, share.rank, fresh=True)
    except OSError as exc:  # the leader's directory: the others then fail to write into it, and say so
        error, tmp = exc, commit.tmp_dir(root, step)
    commit.barrier(group)
    if error is None:
        try:
            written = commit.write_files(tmp, share.files, share.seen)
        except Exception as exc:
            error = commit.write_error(exc)
            if error is None:
                raise
    if error is not None:
        log.error("rank %d: writing checkpoint step %d failed: %s", share.rank, step, error)
        return commit.failed(share.rank, error)
    return commit.report(share.rank, share.hash, share.components, written, share.replay)
