"""`legato requeue RUN_DIR --exit-code N`: a job script's requeue, with `legato run`'s guards.

A job script that runs its launcher and then `scontrol requeue` on exit 75
requeues for ever when an attempt can make no progress (its start-up and
replay outlast the stop signal's lead: it stops before its first checkpoint,
every time). This decides from the launch's exit code and the run's ledger:

- 0, or any code but 75 (stopped) and 124 (hung): the job ends with that code;
- 75 when this job's newest attempt committed no checkpoint past the step it
  resumed: the job ends (exit 1, `failed` recorded) naming why and the fix;
- 75 or 124 once SLURM_RESTART_COUNT reached the budget: the job ends (exit 1);
- otherwise `requeued` is recorded, then `scontrol requeue` (exit 0; SLURM
  runs the job again). A failed requeue is recorded and exits 1.

A repeated hang never reaches here as 124: its ranks exit 1. This module must
never start training or touch a checkpoint; it only reads the ledger and asks
SLURM (legato.slurm.backends) to requeue.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_HUNG, EXIT_OK, EXIT_STOPPED, UsageError
from legato.events import Kind
from legato.orchestrator.ledger import Ledger
from legato.slurm.backends import backend_for


@dataclass(frozen=True)
class Verdict:
    """What the job script does next: `requeue` or not, the job's exit code, and the line that says why."""

    requeue: bool
    exit_code: int
    message: str


@dataclass(frozen=True)
class _Attempt:
    restart: int
    resumed_step: int
    checkpoint_step: int | None  # the newest it committed past `resumed_step`


def _newest_attempt(events: list[dict], job_id: str) -> _Attempt | None:
    """This job's newest attempt in the ledger: where it resumed and the newest checkpoint it committed past that."""
    started = [e for e in events if e["event"] == Kind.ATTEMPT_STARTED and str(e.get("job_id")) == job_id]
    if not started:
        return None
    restart = started[-1].get("restart", 0)
    mine = [e for e in events if str(e.get("job_id")) == job_id and e.get("restart") == restart]
    resumed = next((e["step"] for e in mine if e["event"] == Kind.RESUMED), 0)
    commits = [e["step"] for e in mine if e["event"] == Kind.CHECKPOINT_COMMITTED and e["step"] > resumed]
    return _Attempt(restart, resumed, max(commits, default=None))


def decide(code: int, job_id: str, restarts: int, budget: int, attempt: _Attempt | None) -> Verdict:
    """The decision for job `job_id`'s launch that exited `code`, requeued `restarts` times so far, whose newest attempt
    in the ledger is `attempt` (see the module docstring)."""
    if code not in (EXIT_STOPPED, EXIT_HUNG):
        return Verdict(False, code, f"the launch exited {code}: the job ends here" + (" (training complete)" if code == EXIT_OK else ""))
    if restarts >= budget:
        return Verdict(
            False,
            EXIT_FAILED,
            f"requeue budget exhausted: job {job_id} was requeued {restarts} times and the budget is {budget} "
            "(--max-requeues). Raise it or the job's time limit, then submit the job script again: it resumes from the newest checkpoint.",
        )
    if code == EXIT_STOPPED and (attempt is None or attempt.checkpoint_step is None):
        started = "never started training" if attempt is None else f"resumed at step {attempt.resumed_step} and committed no checkpoint"
        return Verdict(
            False,
            EXIT_FAILED,
            f"not requeued: job {job_id} stopped (exit 75) but its attempt {started} before the stop signal, so the next one "
            "would stop the same way, for ever. Its start-up (and replay) outlasts the signal's lead: give the job an earlier "
            "signal (--signal=USR2@SECONDS) or a longer --time, then submit it again; it resumes from the newest checkpoint.",
        )
    how = "hung (exit 124)" if code == EXIT_HUNG else f"stopped at the checkpoint of step {attempt.checkpoint_step if attempt else '?'}"
    return Verdict(True, EXIT_OK, f"job {job_id} {how}: requeued ({budget - restarts - 1} requeues left)")


def requeue(run_dir: Path, code: int, budget: int, environ: Mapping[str, str] | None = None) -> Verdict:
    """Decide, record the decision in the run's ledger, and requeue the job when it is to be requeued."""
    env = os.environ if environ is None else environ
    if not run_dir.is_dir():
        raise UsageError(f"legato requeue: {run_dir} is not a directory. Pass the run directory the training script was given.")
    if code not in (EXIT_STOPPED, EXIT_HUNG):
        return decide(code, "", 0, budget, None)
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise UsageError(
            "legato requeue: SLURM_JOB_ID is not set, so this is not a SLURM job and there is nothing to requeue. Run it in the "
            "job script, after the launcher (README, the job script)."
        )
    restarts = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    ledger = Ledger(run_dir)
    attempt = _newest_attempt(ledger.read(), job_id)
    verdict = decide(code, job_id, restarts, budget, attempt)
    tag = {"job_id": job_id, "restart": attempt.restart if attempt else 0}
    if not verdict.requeue:
        ledger.append(Kind.FAILED, **tag, exit_code=verdict.exit_code, reason=verdict.message)
        return verdict
    # Recorded first: SLURM ends this shell with SIGTERM as soon as the requeue is accepted.
    ledger.append(Kind.REQUEUED, **tag, budget_left=budget - restarts - 1)
    problem = backend_for("slurm").requeue(job_id)
    if problem:
        ledger.append(Kind.REQUEUE_FAILED, **tag, reason=problem)
        return Verdict(False, EXIT_FAILED, f"not requeued: {problem}")
    return verdict
