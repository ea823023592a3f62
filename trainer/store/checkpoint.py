"""The synchronous checkpoint driver: every rank runs the commit protocol's phases in one collective call.

Used for stop and final checkpoints, and for periodic ones when they are not
written in the background. The phases themselves (stage, write, agree,
publish, prune) and the on-disk layout are legato.store.commit's; this module
only orders them with the barriers a synchronous save needs. It must never
know the Session, and never call the asynchronous driver.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from legato.store import commit
from legato.store.commit import Committed, KillPoint, RankShare

__all__ = ["Committed", "KillPoint", "RankShare", "write_checkpoint"]


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
    tmp = commit.stage(root, step, share.rank, fresh=True)
    commit.barrier(group)
    written = commit.write_files(tmp, share.files, share.seen)
    own = commit.report(share.rank, share.hash, share.components, written, share.replay)
    reports = commit.complete(commit.agree(own, world_size, group))
    commit.kill_point(kill, step, "after_shards")
    ghash = commit.combined_hash(reports)
    if share.rank == commit.LEADER:
        commit.warn_diverged(reports)
        commit.publish(root, tmp, step, world_size, reports, ghash, meta, kill)
        commit.prune(root, keep_last, keep=step)
    commit.barrier(group)
    return commit.committed(root, step, reports, ghash, time.perf_counter() - start)
