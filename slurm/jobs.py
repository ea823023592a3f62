"""A submitted job seen from outside, by its id: is it still alive, how did it end, signal it, cancel it.

Works for a job this process did not submit (a re-attached supervisor, `legato
cancel`): a local job is its submitit controller's pid; a SLURM job is asked
through `sacct`, falling back to `scontrol show job` and `squeue` when
accounting is off. Every scheduler command has a timeout, and a state that
stays unknown is eventually reported as ended, never waited on forever.
Commands are argument lists, never shell strings.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from legato.runtime import processes

UNKNOWN_GRACE_S = 120.0
REQUEUE_TIMEOUT_S = 60.0
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING"}
LOCAL_CONTROLLER = b"submitit.local._local"
UNHEALTHY = ("down", "drain", "fail", "not_responding", "maint", "reboot")  # sinfo's %T; a trailing * means not responding


@dataclass
class JobState:
    name: str
    active: bool


@dataclass
class JobHandle:
    executor: str
    job_id: str
    unknown_grace_s: float = UNKNOWN_GRACE_S
    _unknown_since: float | None = field(default=None, repr=False)

    def state(self) -> JobState:
        if self.executor == "local":
            return JobState("RUNNING", True) if _local_alive(int(self.job_id)) else JobState("ENDED", False)
        name = slurm_state(self.job_id)
        if name != "UNKNOWN":
            self._unknown_since = None
            return JobState(name, name in ACTIVE)
        self._unknown_since = self._unknown_since or time.monotonic()
        if time.monotonic() - self._unknown_since >= self.unknown_grace_s:
            return JobState("UNKNOWN", False)
        return JobState("UNKNOWN", True)

    def signal_tasks(self, sig: signal.Signals, pids: list[int]) -> None:
        """Deliver `sig` to every task of the job (locally: the task pids; on SLURM: every step's tasks)."""
        if self.executor == "local":
            for pid in pids:
                processes.kill(pid, sig)
            return
        processes.output(["scancel", f"--signal={sig.name.removeprefix('SIG')}", self.job_id])

    def cancel(self) -> None:
        if self.executor == "local":
            # submitit's controller stops its tasks on SIGINT (SIGINT, then SIGKILL after a second).
            processes.kill(int(self.job_id), signal.SIGINT)
            return
        processes.output(["scancel", self.job_id])


def slurm_state(job_id: str) -> str:
    """The job's state from sacct, or from scontrol/squeue when accounting does not know it; else UNKNOWN."""
    out = processes.output(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"])
    if out:
        return out.splitlines()[-1].split()[0].rstrip("+")
    out = processes.output(["scontrol", "show", "job", job_id, "-o"])
    for token in (out or "").split():
        if token.startswith("JobState="):
            return token.split("=", 1)[1]
    out = processes.output(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if out:
        return out.split()[0]
    return "UNKNOWN"


def _local_alive(pid: int) -> bool:
    """True while submitit's controller `pid` runs (a zombie or a recycled pid counts as gone)."""
    if not processes.alive(pid):
        return False
    try:
        return LOCAL_CONTROLLER in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def failed_nodes(hosts: list[str]) -> dict[str, str]:
    """Those of `hosts` that SLURM reports down, drained or draining, failing, or not responding: name -> state."""
    if not hosts:
        return {}
    out = processes.output(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N %T"]) or ""
    failed = {}
    for line in out.splitlines():
        name, _, state = line.partition(" ")
        if name in hosts and (state.endswith("*") or any(word in state for word in UNHEALTHY)):
            failed[name] = state
    return failed


def requeue(job_id: str) -> str | None:
    """`scontrol requeue` this job; returns what went wrong, or None."""
    result = processes.run_command(["scontrol", "requeue", job_id], timeout=REQUEUE_TIMEOUT_S)
    return None if result.ok else f"scontrol requeue {job_id}: {result.error}"
