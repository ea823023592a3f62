"""How many CPU threads each rank gives torch: taken from the allocation, never from the machine's core count.

CPU kernels split their work by thread count, and the bits of a sum depend on
that split, so the thread count is part of a run's trajectory: a requeue onto
a node with more cores must not silently change it. The rule, first match
wins: `determinism.threads` when set; else SLURM's `SLURM_CPUS_PER_TASK` (the
CPUs this task was allocated); else the CPUs this process may run on (its
affinity mask, which honours cgroups and taskset) divided among the local
ranks. Free of torch so the job side can record the count before training
starts; it never sets anything itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadCount:
    """A resolved torch thread count and where it came from (for the log)."""

    count: int
    source: str

    def describe(self) -> str:
        return f"{self.count} (from {self.source})"


def resolve_threads(configured: int, local_world_size: int, environ: Mapping[str, str] | None = None) -> ThreadCount:
    """The torch thread count for one rank, and where it came from."""
    env = os.environ if environ is None else environ
    if configured > 0:
        return ThreadCount(configured, "determinism.threads")
    slurm = env.get("SLURM_CPUS_PER_TASK", "").strip()
    if slurm.isdigit() and int(slurm) > 0:
        return ThreadCount(int(slurm), "SLURM_CPUS_PER_TASK")
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ThreadCount(max(1, available // max(1, local_world_size)), f"{available} available CPUs / {local_world_size} local ranks")
