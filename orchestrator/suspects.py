"""Nodes a run has reason to avoid: where its last job hung, or where one of its ranks was persistently slower.

With `slurm.exclude_suspect_nodes` the supervisor leaves them out of the next job it submits (sbatch `--exclude`),
at most `slurm.max_suspect_nodes` of them in one `legato run` session, beside the nodes SLURM itself reports
failed. This module only reads the ledger and the ranks' pace files, through what `legato status` shows; it never
decides to submit.
"""

from __future__ import annotations

from pathlib import Path

from legato.events import Kind, stuck_in_own_code
from legato.orchestrator.status import summarize


def suspect_nodes(run_dir: Path, session: list[dict], job_id: str) -> dict[str, str]:
    """The nodes of job `job_id` under suspicion, each with why (host -> reason): where a `hang` record's silent ranks
    ran (ranks of other hosts that never answered), and the host it names unless that is only where the hang was
    found (ranks were silent, and the named rank waited for them rather than in its own code); and the host of every
    rank `legato status` names persistently slower in that job's attempts."""
    found: dict[str, str] = {}
    for e in session:
        if e["event"] != Kind.HANG or str(e.get("job_id")) != str(job_id):
            continue
        for rank, host in (e.get("silent") or {}).items():
            found.setdefault(host, f"rank {rank} there never answered when the job hung at step {e['step']}")
        if not e.get("silent") or stuck_in_own_code(e):
            found.setdefault(e["host"], f"the job hung there at step {e['step']}")
    for attempt in summarize(run_dir, session).attempts:
        if attempt.job_id == str(job_id):
            for straggler in attempt.stragglers:
                found.setdefault(straggler.host, straggler.label)
    return found


def within_budget(suspects: dict[str, str], already: set[str], budget: int) -> dict[str, str]:
    """The suspects to exclude now: those not excluded yet, in order, while the session's count stays within `budget`."""
    room = max(0, budget - len(already))
    return dict([(host, why) for host, why in suspects.items() if host not in already][:room])


def suspected_before(session: list[dict]) -> set[str]:
    """The nodes this session already excluded on suspicion (what counts against `slurm.max_suspect_nodes`)."""
    return {host for e in session if e["event"] == Kind.RESUBMITTED for host in e.get("suspect_nodes", {})}
