"""SLURM's pending reasons, said aloud: what each means, and which can never clear (with the fix).

SLURM keeps a job that it can never start (more nodes than its partition
has: PartitionNodeLimit, or PartitionConfig on SLURM 22.05, a longer time than the partition allows, an account or QOS it does not
know, constraints no node has, nodes that do not exist) PENDING forever,
naming the reason in squeue's %r. `blocked` tells those apart from reasons
that clear by themselves (Resources, Priority, ...), asking SLURM about the
partition, the job and the nodes where the reason alone cannot decide. It
must NEVER cancel, change or submit a job: it reads and explains.
"""

from __future__ import annotations

import re

from legato.system import processes

TRANSIENT = {
    "Resources": "waiting for nodes or CPUs to free up",
    "Priority": "jobs of higher priority go first",
    "Dependency": "waiting for a job it depends on",
    "BeginTime": "its start time has not come yet",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "a node it requires is down, drained or reserved",
    "PartitionNodeLimit": "too few of its partition's nodes are up",
    "PartitionConfig": "its partition cannot give it what it asks for now",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "NodeDown": "a node it needs is down",
    "Reservation": "waiting for its reservation to start",
    "None": "not yet considered by the scheduler",
}
NEVER_CLEARS = (
    "PartitionNodeLimit",
    "PartitionConfig",
    "PartitionTimeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "ReqNodeNotAvail",
    "BadConstraints",
)


def reason_word(reason: str) -> str:
    """The reason's leading word: squeue writes `ReqNodeNotAvail, UnavailableNodes:n[1-2]` for one of them."""
    return reason.split(",", 1)[0].strip()


def describe(reason: str) -> str:
    """The reason with a few words on what it means, for the live line and `legato status`."""
    meaning = TRANSIENT.get(reason_word(reason))
    return f"{reason} ({meaning})" if meaning else reason


def blocked(job_id: str, reason: str | None) -> str | None:
    """Why SLURM can never start pending job `job_id`, with the fix, or None when `reason` may still clear."""
    word = reason_word(reason or "")
    if word not in NEVER_CLEARS:
        return None
    job = _fields(["scontrol", "show", "job", job_id, "-o"])
    partition = job.get("Partition", "?")
    if word in ("PartitionNodeLimit", "PartitionConfig"):
        return _node_limit(job, partition, word == "PartitionNodeLimit")
    if word == "PartitionTimeLimit":
        limit = _fields(["scontrol", "show", "partition", partition, "-o"]).get("MaxTime", "?")
        return (
            f"its time limit ({job.get('TimeLimit', '?')}) is above partition {partition}'s MaxTime ({limit}). Lower "
            "slurm.time_min to fit, or pick a partition that allows it (slurm.partition)."
        )
    if word == "InvalidAccount":
        return (
            f"SLURM does not accept account {job.get('Account', '?')!r} for this user on partition {partition}. Set "
            "slurm.account to one that `sacctmgr show assoc user=$USER` lists, or leave it empty for the default."
        )
    if word == "InvalidQOS":
        return (
            f"SLURM does not accept QOS {job.get('QOS', '?')!r} for this account on partition {partition}. Set slurm.qos "
            "to one that `sacctmgr show assoc user=$USER format=account,qos` lists, or leave it empty for the default."
        )
    if word == "BadConstraints":
        return (
            f"no node of partition {partition} has the features it asks for (constraints {job.get('Features', '?')!r}). "
            "Fix or remove the constraint in slurm.extra_sbatch."
        )
    return _missing_nodes(reason or "")


def _node_limit(job: dict[str, str], partition: str, unknown_blocks: bool) -> str | None:
    """More nodes than the partition has or allows can never start; fewer wait for down or drained nodes to return.

    `unknown_blocks`: whether a count scontrol does not tell counts as too many (PartitionNodeLimit names the node
    count; PartitionConfig may be about anything the partition lacks now, so only a count known too high blocks).
    """
    part = _fields(["scontrol", "show", "partition", partition, "-o"])
    wanted, total, most = _count(job.get("NumNodes")), _count(part.get("TotalNodes")), _count(part.get("MaxNodes"))
    limit = min(n for n in (total, most) if n is not None) if total is not None or most is not None else None
    if wanted is not None and limit is not None:
        if wanted <= limit:
            return None
    elif not unknown_blocks:
        return None
    have = f"partition {partition} has {part.get('TotalNodes', '?')} node(s) (MaxNodes {part.get('MaxNodes', '?')})"
    fix = f"Lower slurm.nodes to {limit} or less" if limit else "Lower slurm.nodes"
    asked = job.get("NumNodes", "?").split("-")[0]
    return f"it asks for {asked} node(s) and {have}. {fix}, or pick a partition with more nodes (slurm.partition)."


def _missing_nodes(reason: str) -> str | None:
    """ReqNodeNotAvail clears when the nodes return, unless a node it names does not exist at all."""
    listed = reason.partition("UnavailableNodes:")[2].strip()
    if not listed:
        return None
    names = (processes.output(["scontrol", "show", "hostnames", listed]) or listed).split()
    missing = [name for name in names if processes.output(["scontrol", "show", "node", name, "-o"]) is None]
    if not missing:
        return None
    return (
        f"it requires node(s) {', '.join(missing)}, which this cluster does not have. Remove them from the job's node "
        "list (slurm.extra_sbatch: nodelist)."
    )


def _fields(cmd: list[str]) -> dict[str, str]:
    """`Key=Value` tokens of scontrol's one-line output (empty when it does not answer)."""
    out = processes.output(cmd) or ""
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


def _count(text: str | None) -> int | None:
    """A node count such as `2`, `2-2` or `UNLIMITED` (None: no limit, or not known)."""
    match = re.match(r"\d+", text or "")
    return int(match.group()) if match else None
