"""A local job's ranks are forked warm from its one submitit task (legato.orchestrator.local_ranks): each is a
process of its own under that task, named for its rank, writing its own submitit logs; the run trains and is
cancelled as before. Read from /proc while the job trains, as `ps` would show it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.cli import ledger, legato, run_args, wait_for

pytestmark = pytest.mark.slow


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_ranks_of_a_local_job_are_forked_from_its_one_task(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ("local.tasks=3", "train.steps=100000", "chaos.step_sleep_s=0.2", "repro.enabled=false")
    proc = legato(*run_args(run_dir, *sets), "--detach")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        wait_for(lambda: len(_started(run_dir)) == 3, 300, "three ranks")
        wait_for(lambda: any(e["event"] == "bucket_layout" for e in ledger(run_dir)), 300, "the first step")
        controller = int(next(e["job_id"] for e in ledger(run_dir) if e["event"] == "submitted"))
        pids = {e["rank"]: e["pid"] for e in _started(run_dir)}
        tasks = {parent_of(pid) for pid in pids.values()}
        assert len(tasks) == 1 and tasks.isdisjoint(pids.values()), (pids, tasks)
        task = tasks.pop()
        assert parent_of(task) == controller
        assert b"submitit.core._submit" in Path(f"/proc/{task}/cmdline").read_bytes()
        for rank, pid in pids.items():
            assert Path(f"/proc/{pid}/comm").read_text().strip() == f"legato-rank{rank}"
    finally:
        assert legato("cancel", str(run_dir)).returncode == 0
    job = run_dir / "submitit" / str(controller)
    for rank in range(3):
        log = (job / f"{controller}_{rank}_log.err").read_text()
        assert re.search(rf"rank {rank} trains on cpu", log), log[-2000:]


def _started(run_dir: Path) -> list[dict]:
    return [e for e in ledger(run_dir) if e["event"] == "rank_started"] if (run_dir / "ledger.jsonl").exists() else []
