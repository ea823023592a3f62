"""`legato run` end to end: real submitit LocalExecutor, 2 tasks, gloo, real signals and SIGKILLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, gpt_reference, manifest
from helpers.cli import ledger, legato, run_args, status, wait_for
from helpers.shared_runs import SharedRuns

pytestmark = pytest.mark.slow


def reference_hash(shared_runs: SharedRuns, *sets: str) -> str:
    """The final global hash of an uninterrupted `python -m legato` run of the same settings."""
    return manifest(gpt_reference(shared_runs, *sets))["global_hash"]


def test_two_signals_three_attempts_every_resume_verified(shared_runs: SharedRuns, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = legato(*run_args(run_dir, "chaos.signal_rank=1", "chaos.signal_at_steps=[7,19]"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verified ✓" in proc.stdout

    data = status(run_dir)
    assert data["finished"] is True and data["state"] == "finished"
    attempts = data["attempts"]
    assert len(attempts) == 3
    assert len({a["job_id"] for a in attempts}) == 1, "the job requeued itself; no resubmission"
    assert [a["restart"] for a in attempts] == [0, 1, 2]
    assert [a["resumed_from_step"] for a in attempts] == [None, 8, 20]
    assert [a["verified"] for a in attempts] == [None, True, True]
    # Each resume replayed from its base (every 4 steps) up to the checkpoint, identical.
    assert [a["replay"] and (a["replay"]["from_step"], a["replay"]["steps"], a["replay"]["identical"]) for a in attempts] == [
        None,
        (4, 4, True),
        (16, 4, True),
    ]
    assert "replay ✓ 4 steps from step 4" in proc.stdout
    # Each stop held its state as its base (written with it) and the steps since: its line says so.
    assert "signal checkpoint at step 8 committed in" in proc.stdout
    assert "(the state of step 4 and 4 steps to replay from it; " in proc.stdout, proc.stdout[-3000:]
    assert [a["ended"] for a in attempts] == ["requeued", "requeued", "finished"]
    assert data["final_global_hash"] == reference_hash(shared_runs)

    table = legato("status", str(run_dir)).stdout
    assert "FINISHED" in table and table.count("replay ✓ 4 steps") == 2 and table.count("✓") == 4
    logs = legato("logs", str(run_dir), "--rank", "1").stdout
    assert "_1_log.err <==" in logs and "chaos: rank 1 sends itself SIGUSR2 after step 7" in logs


def test_hard_kill_resubmits_and_resumes_from_last_periodic_checkpoint(shared_runs: SharedRuns, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ("train.steps=200", "checkpoint.every_steps=25")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "legato.orchestrator.cli", *run_args(run_dir, *sets)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                run_dir.joinpath("ledger.jsonl").exists()
                and any(e["event"] == "checkpoint_committed" and e["step"] >= 50 for e in ledger(run_dir))
            ),
            what="a periodic checkpoint",
        )
        pids = [e["pid"] for e in ledger(run_dir) if e["event"] == "rank_started"]
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed_after = max(e["step"] for e in ledger(run_dir) if e["event"] == "checkpoint_committed")
        out, _ = supervisor.communicate(timeout=300)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, out[-3000:]
    assert "without requeuing itself; resubmitted" in out

    data = status(run_dir)
    first, second = data["attempts"]
    assert first["job_id"] != second["job_id"] and "resubmitted" in first["ended"]
    assert second["resumed_from_step"] % 25 == 0 and second["resumed_from_step"] >= killed_after
    assert second["verified"] is True
    assert data["resubmissions"] == 1
    assert data["final_global_hash"] == reference_hash(shared_runs, *sets)


def test_requeue_budget_stops_a_job_that_would_requeue_forever(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = legato(*run_args(run_dir, "slurm.max_requeues=1", "chaos.signal_at_steps=[5,10,15,20]"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    data = status(run_dir)
    assert data["state"] == "failed" and not data["finished"]
    assert "requeue budget exhausted" in data["failure"] and "slurm.max_requeues is 1" in data["failure"]
    assert len(data["attempts"]) == 2
    assert data["attempts"][-1]["ended"] == "failed"
    # Nothing is lost: the stop checkpoint is there and a new `legato run` would continue from it.
    assert manifest(run_dir)["step"] == 11


def test_detach_watch_and_preemption_by_the_supervisor(shared_runs: SharedRuns, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Each attempt is preempted 10 s after the supervisor saw it training, and a step takes at least 100 ms (chaos
    # sleep, bits unchanged): one attempt trains at most 100 steps plus what the supervisor's 0.5 s polls and the agreed
    # stop add, so of the 130 steps (30 of margin) two attempts at least train anywhere, and a busy machine's slower
    # steps add attempts without adding CPU (the sleep is idle). The requeue budget is high enough never to end the run.
    sets = ("train.steps=130", "chaos.step_sleep_s=0.1", "chaos.preempt_every_s=10", "run.name=detached", "slurm.max_requeues=100")
    proc = legato(*run_args(run_dir, *sets), "--detach")
    assert proc.returncode == 0, proc.stderr
    assert "submitted" in proc.stdout and "legato watch" in proc.stdout

    again = legato(*run_args(run_dir, *sets))
    assert again.returncode == 2 and "Another legato supervisor is attached" in again.stderr

    watched = legato("watch", str(run_dir), timeout=400)
    assert watched.returncode == 0, watched.stdout[-3000:] + watched.stderr[-2000:]
    assert "following" in watched.stdout

    data = status(run_dir)
    assert data["finished"] and data["all_resumes_verified"]
    assert len(data["attempts"]) >= 2
    assert any(e["event"] == "preempt_sent" for e in ledger(run_dir))
    assert data["final_global_hash"] == reference_hash(shared_runs, "train.steps=130")


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_cancel_ends_the_run_and_keeps_checkpoints(tmp_path: Path, sigint: str) -> None:
    """ "ignored": started as a non-interactive shell starts a command in the background (`legato run ... &` in a
    script), with SIGINT ignored, which the controller would inherit and `legato cancel` then could not stop it."""
    run_dir = tmp_path / "run"
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    args = [*run_args(run_dir, "train.steps=5000", "checkpoint.every_steps=10"), "--detach"]
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=ignore,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)), what="a checkpoint")
    cancelled = legato("cancel", str(run_dir))
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(lambda: status(run_dir)["state"] == "cancelled", what="the cancelled state")
    assert legato("watch", str(run_dir)).returncode == 1
    assert manifest(run_dir)["step"] >= 10
