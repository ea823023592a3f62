"""Threads from the allocation, in one process: the rule, and the check of the count every checkpoint holds.

A resume under another count, with real processes: e2e/test_threads_resume.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from legato.errors import UsageError
from legato.store.resumable import check_compatible
from legato.system.threads import resolve_threads


def test_thread_count_comes_from_config_then_slurm_then_affinity() -> None:
    assert resolve_threads(3, 2, {"SLURM_CPUS_PER_TASK": "8"}).count == 3
    slurm = resolve_threads(0, 2, {"SLURM_CPUS_PER_TASK": "6"})
    assert (slurm.count, slurm.source) == (6, "SLURM_CPUS_PER_TASK")
    local = resolve_threads(0, 2, {})
    assert local.count == max(1, len(os.sched_getaffinity(0)) // 2) and "available CPUs / 2 local ranks" in local.source
    assert resolve_threads(0, 10_000, {}).count == 1


def test_compatibility_check_refuses_another_thread_count_in_strict_and_warns_in_fast(caplog: pytest.LogCaptureFixture) -> None:
    training = {"determinism": {"mode": "strict"}}  # a run of legato's own, from a config: the fix names its keys
    saved = {"world_size": 2, "torch_version": "2.13.0", "threads": 4, "training": training}
    with pytest.raises(UsageError, match="written with 4 torch threads per rank, but this run has 2") as info:
        check_compatible(saved, Path("/r/checkpoints/step_5"), 2, training, "2.13.0", threads=2, strict=True)
    assert "determinism.mode: fast" in str(info.value) and "slurm.cpus_per_task" in str(info.value)
    check_compatible(saved, Path("/r/checkpoints/step_5"), 2, training, "2.13.0", threads=2, strict=False)
    assert "Continuing because determinism.mode is fast" in caplog.text
    check_compatible(saved, Path("/r/checkpoints/step_5"), 2, training, "2.13.0", threads=4, strict=True)
    # A script's own Session (no config, training None): the fix names the API's argument, never a config key.
    script = {**saved, "training": None}
    with pytest.raises(UsageError, match="written with 4 torch threads per rank") as info:
        check_compatible(script, Path("/r/checkpoints/step_5"), 2, None, "2.13.0", threads=2, strict=True)
    assert 'seed_everything(seed, rank, mode="fast")' in str(info.value) and "determinism.mode" not in str(info.value)
    assert "slurm." not in str(info.value) and "--cpus-per-task" in str(info.value)
