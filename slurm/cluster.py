"""The SLURM backend: a legato job as an sbatch job, watched and steered through SLURM's own commands.

State comes from `sacct`, falling back to `scontrol show job` and `squeue`
when accounting is off; a pending job's reason from `squeue`, and whether
SLURM can never start it (`legato.slurm.pending`). Every
scheduler command has a timeout and is an argument list, never a shell
string. It must NEVER submit without `sbatch` and `srun` on PATH, and never
build a command from config strings (submitit quotes every `#SBATCH` value).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Mapping
from typing import Any

from legato.config import Config
from legato.errors import UsageError
from legato.slurm import pending, submission
from legato.slurm.backend import Backend, JobPlace, JobState
from legato.system import processes

REQUEUE_TIMEOUT_S = 60.0
ACTIVE = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "CONFIGURING",
    "COMPLETING",
    "RESIZING",
    "SUSPENDED",
    "STAGE_OUT",
    "SIGNALING",
}
UNHEALTHY = ("down", "drain", "fail", "not_responding", "maint", "reboot")  # sinfo's %T; a trailing * means not responding
TOOLS = ("sbatch", "srun")


class SlurmBackend(Backend):
    """Jobs on a SLURM cluster through submitit's SlurmExecutor."""

    name = "slurm"
    state_poll_interval_s = 3.0  # an sacct call: be gentle with the accounting daemon
    records_state_changes = True
    signals_task_pids = False
    shares_terminal = False
    tasks_die_with_controller = False
    forks_ranks = False  # srun starts every task

    def validate(self, cfg: Config) -> None:
        """SLURM's commands must be on PATH: submitit writes an sbatch script whose tasks start through srun."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise UsageError(
                f"executor is slurm but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH. Run legato "
                "on a SLURM login node, start a local cluster with `legato devcluster up`, or set executor: local."
            )

    def submit(self, cfg: Config, task: Callable[[], Any], exclude: tuple[str, ...] = ()) -> str:
        """sbatch the job, excluding `exclude` on top of any node the config's extra_sbatch excludes."""
        self.validate(cfg)
        return submission.submit(cfg, submission.slurm_executor(cfg, submission.job_folder(cfg), exclude), task)

    def identify(self, env: Any, ledger_events: Callable[[], list[dict]]) -> JobPlace:
        """SLURM counts the job's restarts itself (SLURM_RESTART_COUNT) and names its nodes."""
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        return JobPlace(str(env.job_id), restart, tuple(env.hostnames))

    def state(self, job_id: str) -> JobState:
        """sacct's state (or scontrol's, or squeue's); a pending job also says why it waits, and whether it never will start."""
        name = slurm_state(job_id)
        reason = pending_reason(job_id) if name == "PENDING" else None
        return JobState(name, name in ACTIVE or name == "UNKNOWN", reason, pending.blocked(job_id, reason))

    def signal(self, job_id: str, sig: signal.Signals, pids: list[int]) -> None:
        """`scancel --signal` reaches every step's tasks; the pids are not needed."""
        processes.output(["scancel", f"--signal={sig.name.removeprefix('SIG')}", job_id])

    def cancel(self, job_id: str) -> None:
        """`scancel` the job."""
        processes.output(["scancel", job_id])

    def requeue(self, job_id: str) -> str | None:
        """`scontrol requeue` the job. SLURM then ends its tasks with SIGTERM at once: this task ignores it (in every
        thread) so that the decision gets on record; it exits right after, and SIGKILL still comes after KillWait."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        result = processes.run_command(["scontrol", "requeue", job_id], timeout=REQUEUE_TIMEOUT_S)
        return None if result.ok else f"scontrol requeue {job_id}: {result.error}"

    def exit_code_after_requeue(self, code: int) -> int:
        """SLURM runs the job again whatever its tasks exit with."""
        return code

    def failed_nodes(self, hosts: list[str]) -> dict[str, str]:
        """Those of `hosts` that sinfo reports down, drained or draining, failing, or not responding."""
        if not hosts:
            return {}
        out = processes.output(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N %T"]) or ""
        failed = {}
        for line in out.splitlines():
            name, _, state = line.partition(" ")
            if name in hosts and (state.endswith("*") or any(word in state for word in UNHEALTHY)):
                failed[name] = state
        return failed

    def master_addr(self, hosts: tuple[str, ...]) -> str:
        """The job's first node."""
        return hosts[0]

    def tasks_per_node(self, cfg: Config) -> int:
        """slurm.tasks_per_node."""
        return cfg.slurm.tasks_per_node

    def job_environ(self, cfg: Config) -> Mapping[str, str] | None:
        """Submission always passes --cpus-per-task, so SLURM sets SLURM_CPUS_PER_TASK in the job."""
        return {"SLURM_CPUS_PER_TASK": str(cfg.slurm.cpus_per_task)}


def slurm_state(job_id: str) -> str:
    """The job's state from sacct, or from scontrol/squeue when accounting does not know it; else UNKNOWN.

    sacct's PREEMPTED is the ended instance of a job that PreemptMode=REQUEUE puts back in the queue: the controller's
    own state says whether it was requeued (PENDING) or cancelled."""
    out = processes.output(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"])
    if out:
        name = out.splitlines()[-1].split()[0].rstrip("+")
        if name == "PREEMPTED":
            return _controller_state(job_id) or name
        return name
    controller = _controller_state(job_id)
    if controller:
        return controller
    out = processes.output(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if out:
        return out.split()[0]
    return "UNKNOWN"


def _controller_state(job_id: str) -> str | None:
    """`scontrol show job`'s JobState, None when the controller does not know the job."""
    out = processes.output(["scontrol", "show", "job", job_id, "-o"])
    for token in (out or "").split():
        if token.startswith("JobState="):
            return token.split("=", 1)[1]
    return None


def pending_reason(job_id: str) -> str | None:
    """Why SLURM keeps the job pending (squeue's %r: Priority, Resources, BeginTime...), or None when it won't say."""
    out = processes.output(["squeue", "-h", "-j", job_id, "-o", "%r"])
    return out.strip() or None if out else None
