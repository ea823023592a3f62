"""Acting on a run from outside its supervisor: hand it to a background `legato watch`, or cancel it.

These are the workflows behind `legato run --detach` and `legato cancel`; they
return plain data and the CLI says what happened. This module must never
print, and never touch a run's checkpoints: a cancelled run keeps them so that
the same `legato run` continues from them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from legato.config import load_config
from legato.events import Kind
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.rundir import SupervisorLock, captured_config
from legato.orchestrator.status import current_job, current_session, session_exit_code
from legato.paths import RunPaths
from legato.slurm.backends import backend_for

DETACH_WAIT_S = 120.0


@dataclass
class Handoff:
    """How handing a run to a background supervisor went: the job it submitted, or its exit code, or neither in time."""

    run_dir: Path
    pid: int
    log: Path
    job_id: str | None = None
    exit_code: int | None = None


def hand_off(run_dir: Path, wait_s: float = DETACH_WAIT_S) -> Handoff:
    """Start `legato watch RUN_DIR` in its own session and wait until it has submitted a job, exited, or `wait_s` passed."""
    run_dir = run_dir.resolve()
    log_path = RunPaths(run_dir).supervisor_log
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", "legato.orchestrator.cli", "watch", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handoff = Handoff(run_dir, child.pid, log_path)
    ledger = Ledger(run_dir)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        handoff.job_id = current_job(current_session(ledger.read()))
        if handoff.job_id is not None:
            return handoff
        if child.poll() is not None:
            handoff.exit_code = child.returncode
            return handoff
        time.sleep(0.2)
    return handoff


def cancel_run(run_dir: Path) -> tuple[bool, str | None]:
    """Cancel the run's job and, when no supervisor is attached to record it, end the run; (was running, job id)."""
    cfg = load_config(captured_config(run_dir))
    ledger = Ledger(run_dir)
    session = current_session(ledger.read())
    if session_exit_code(session) is not None:
        return False, None
    job_id = current_job(session)
    ledger.append(Kind.CANCEL_REQUESTED, job_id=job_id)
    if job_id is not None:
        backend_for(cfg.executor).cancel(job_id)
    if not SupervisorLock(run_dir).held_elsewhere():
        ledger.append(Kind.CANCELLED, job_id=job_id, reason="cancelled by the user")
    return True, job_id
