"""The slurm.conf of legato's dev clusters, written once: the one-node `devcluster` and the multi-node `multinode`.

Both clusters share every rule that makes requeues fast and jobs cheap
(credential expiry, scheduler interval, KillWait, linuxproc tracking, no
task plugin, requeue allowed); each passes only where its files live, its
controller and its nodes. It must NEVER write a file or start a process: it
returns text (and asks `slurmd -C` what this machine holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from legato.errors import UsageError
from legato.system import processes

PARTITION = "debug"
# A second partition over the same nodes whose jobs preempt the default one's: `sbatch -p urgent` on a busy node sends
# the jobs in the way SLURM's preemption (SIGCONT and SIGTERM to their steps' tasks, then their end time GraceTime
# later, then a requeue), as a production cluster with preemptible partitions does.
URGENT_PARTITION = "urgent"


@dataclass(frozen=True)
class Settings:
    """Fast defaults: a requeued job is eligible cred_expire + 1 s after its requeue; a preempted job's tasks get
    SIGTERM and preempt_grace_s (the default partition's GraceTime) to stop before SLURM ends and requeues it."""

    cred_expire_s: int = 10
    sched_interval_s: int = 5
    kill_wait_s: int = 10
    preempt_grace_s: int = 90
    accounting: bool = True


def slurm_conf(
    settings: Settings,
    cluster: str,
    controller: str,
    node_lines: Sequence[str],
    files: Mapping[str, str],
    extra: Sequence[str] = (),
    munge_socket: str | None = None,
) -> str:
    """slurm.conf's text for a dev cluster named `cluster`: `controller` is SlurmctldHost, `node_lines` its
    NodeName lines, `files` where state, pids and logs go (slurm.conf key -> path), `extra` lines of its own."""
    auth = f"cred_expire={settings.cred_expire_s}" + (f",socket={munge_socket}" if munge_socket else "")
    accounting = (
        ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost"]
        if settings.accounting
        else ["AccountingStorageType=accounting_storage/none"]
    )
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={controller}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"AuthInfo={auth}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "JobRequeue=1",
        f"SchedulerParameters=sched_interval={settings.sched_interval_s},bf_interval={settings.sched_interval_s}",
        f"KillWait={settings.kill_wait_s}",
        "MinJobAge=3600",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        *extra,
        *(f"{key}={path}" for key, path in files.items()),
        *accounting,
        *node_lines,
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={settings.preempt_grace_s}",
        f"PartitionName={URGENT_PARTITION} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def node_line() -> str:
    """`slurmd -C`'s node line, with RealMemory a little below what it detected (else the node drains)."""
    detected = processes.output(["slurmd", "-C"]) or ""
    line = next((ln for ln in detected.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise UsageError(f"`slurmd -C` did not describe this node: {detected.strip() or 'no output'}")
    fields = []
    for token in line.split():
        key, _, value = token.partition("=")
        if key == "RealMemory":
            value = str(int(int(value) * 0.9))
        fields.append(f"{key}={value}")
    return " ".join(fields) + " State=UNKNOWN"
