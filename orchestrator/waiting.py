"""Whether the run's current job waits in the scheduler's queue, why, and for how long, as the ledger tells it.

A pure function of the session's events (the supervisor's `job_state` and
`pending_reason` records), so that the live line, `legato watch` and
`legato status` say the same thing. Nothing here writes or asks the scheduler.
"""

from __future__ import annotations

from legato.events import JOB_SUBMISSIONS, TERMINAL, Kind
from legato.orchestrator.status import current_job

PENDING = "PENDING"


def waiting_job(session: list[dict], now: float) -> dict | None:
    """The `WAITING` report (job id, reason, seconds waited) while the current job is pending, else None."""
    job_id = current_job(session)
    states = [i for i, e in enumerate(session) if e["event"] == Kind.JOB_STATE and str(e.get("job_id")) == str(job_id)]
    if job_id is None or not states or session[states[-1]]["state"] != PENDING:
        return None
    later = session[states[-1] :]
    if any(e["event"] == Kind.ATTEMPT_STARTED or e["event"] in TERMINAL for e in later):
        return None
    # A job's first pending state is recorded at the first poll after its submission: it has waited since then.
    since = later[0]["time"]
    if len(states) == 1:
        since = min([since, *(e["time"] for e in session if e["event"] in JOB_SUBMISSIONS and str(e.get("job_id")) == str(job_id))])
    reasons = [e["reason"] for e in later if e["event"] == Kind.PENDING_REASON and str(e.get("job_id")) == str(job_id)]
    return {"job_id": str(job_id), "reason": reasons[-1] if reasons else None, "waited_s": round(max(0.0, now - since), 1)}
