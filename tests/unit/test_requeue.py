"""`legato requeue` decides a job script's requeue from the launch's exit code and the run's ledger: the real command
in a subprocess, with a fake `scontrol` first on PATH that records its arguments (the decision's logic only; the same
command requeues real jobs on the devcluster in tests/cluster/test_slurm.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.cli import assert_usage_error, legato

from legato.events import Kind
from legato.ledger_file import read_records, record

JOB = "4242"


@pytest.fixture
def slurm(tmp_path: Path) -> dict[str, str]:
    """A fake scontrol (exit FAKE_SCONTROL_RC, default 0) that appends its arguments to tmp_path/scontrol.calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\nexit "${{FAKE_SCONTROL_RC:-0}}"\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": JOB, "SLURM_RESTART_COUNT": "1"}


def attempt(run: Path, restart: int, resumed: int | None, commits: list[int]) -> None:
    """One script attempt of job JOB in the ledger: where it resumed (None: a fresh start) and what it committed."""
    tag = {"job_id": JOB, "restart": restart}
    record(run, Kind.ATTEMPT_STARTED, **tag, executor="script", hosts=["n1"], world_size=2)
    if resumed is not None:
        record(run, Kind.RESUMED, **tag, step=resumed, match=True)
    for step in commits:
        record(run, Kind.CHECKPOINT_COMMITTED, **tag, step=step, global_hash="h", seconds=0.1, bytes=1, reason="periodic")


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "scontrol.calls"
    return path.read_text().splitlines() if path.exists() else []


def kinds(run: Path) -> list[str]:
    return [e["event"] for e in read_records(run) if e["event"] in (Kind.REQUEUED, Kind.FAILED, Kind.REQUEUE_FAILED)]


def test_a_stop_after_progress_is_recorded_then_requeued(tmp_path: Path, slurm: dict[str, str]) -> None:
    run = tmp_path / "run"
    attempt(run, 1, 8, [12, 16])
    done = legato("requeue", str(run), "--exit-code", "75", "--max-requeues", "3", **slurm)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path) == [f"requeue {JOB}"] and "stopped at the checkpoint of step 16: requeued (1 requeues left)" in done.stderr
    (requeued,) = [e for e in read_records(run) if e["event"] == Kind.REQUEUED]
    assert (requeued["restart"], requeued["budget_left"]) == (1, 1)


@pytest.mark.parametrize(("resumed", "commits"), [(None, []), (8, []), (8, [8])], ids=["fresh", "resumed", "stopped-in-replay"])
def test_a_stop_without_a_new_checkpoint_ends_the_job_instead_of_a_loop(
    tmp_path: Path, slurm: dict[str, str], resumed: int | None, commits: list[int]
) -> None:
    run = tmp_path / "run"
    attempt(run, 0, resumed, commits)
    done = legato("requeue", str(run), "--exit-code", "75", **slurm)
    assert done.returncode == 1 and calls(tmp_path) == [], done.stderr
    assert "for ever" in done.stderr and "--signal=USR2@" in done.stderr and kinds(run) == [Kind.FAILED]


def test_a_job_that_never_reached_its_session_is_not_requeued(tmp_path: Path, slurm: dict[str, str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    done = legato("requeue", str(run), "--exit-code", "75", **slurm)
    assert done.returncode == 1 and "never started training" in done.stderr and calls(tmp_path) == []


def test_a_hang_is_requeued_without_progress_but_within_the_budget(tmp_path: Path, slurm: dict[str, str]) -> None:
    run = tmp_path / "run"
    attempt(run, 0, None, [])
    assert legato("requeue", str(run), "--exit-code", "124", **slurm).returncode == 0
    assert calls(tmp_path) == [f"requeue {JOB}"]
    spent = legato("requeue", str(run), "--exit-code", "124", "--max-requeues", "1", **slurm)
    assert spent.returncode == 1 and "requeue budget exhausted" in spent.stderr and len(calls(tmp_path)) == 1


@pytest.mark.parametrize("code", ["0", "1", "3"])
def test_other_exit_codes_end_the_job_with_that_code_and_record_nothing(tmp_path: Path, slurm: dict[str, str], code: str) -> None:
    run = tmp_path / "run"
    attempt(run, 0, None, [4])
    done = legato("requeue", str(run), "--exit-code", code, **slurm)
    assert done.returncode == int(code) and calls(tmp_path) == [] and kinds(run) == []


def test_a_failed_scontrol_is_recorded_and_exits_1(tmp_path: Path, slurm: dict[str, str]) -> None:
    run = tmp_path / "run"
    attempt(run, 0, None, [4])
    done = legato("requeue", str(run), "--exit-code", "75", **slurm, FAKE_SCONTROL_RC="1")
    assert done.returncode == 1 and "not requeued: scontrol requeue 4242" in done.stderr
    assert kinds(run) == [Kind.REQUEUED, Kind.REQUEUE_FAILED]


def test_outside_slurm_or_without_its_run_directory_it_is_refused(tmp_path: Path, slurm: dict[str, str]) -> None:
    outside = legato("requeue", str(tmp_path), "--exit-code", "75", **{**slurm, "SLURM_JOB_ID": ""})
    assert_usage_error(outside, "SLURM_JOB_ID is not set")
    assert_usage_error(legato("requeue", str(tmp_path / "missing"), "--exit-code", "75", **slurm), "is not a directory")
    assert calls(tmp_path) == []
