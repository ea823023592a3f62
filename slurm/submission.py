"""Submitting a legato job through submitit: the parameters of its LocalExecutor and its SLURM executor.

Turns the validated config into executor parameters (time limit, signal and
lead, requeue, nodes, tasks, resources, extra sbatch options, setup lines)
and submits the task callable it is given. Values from the config reach sbatch only through
submitit, which quotes every `#SBATCH` value; this module never builds a
shell command from config strings, and never chooses between the executors
(each backend of `legato.slurm.backends` picks its own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError

from legato.config import Config
from legato.errors import UsageError
from legato.paths import RunPaths
from legato.slurm.startmask import launcher
from legato.system.forking import FORKS
from legato.system.launch_env import determinism_environ
from legato.system.processes import run_command

log = logging.getLogger(__name__)

NO_LIMIT_MIN = 60 * 24 * 365  # LocalExecutor always has a time limit; "none" means a year
GPU_LIST_TIMEOUT_S = 10


def submit(cfg: Config, executor: submitit.Executor, task: Callable[[], Any]) -> str:
    """Submit one job that runs `task` on every task of the job through `executor`; returns its job id. submitit
    pickles `task` into the run directory, so it must hold nothing secret."""
    with _job_environment(cfg):
        try:
            job = executor.submit(task)
        except (FailedJobError, FailedSubmissionError) as exc:
            raise UsageError(
                f"sbatch refused the job: {str(exc).strip()}. Check the slurm section of the config "
                "(partition, account, qos, time_min, extra_sbatch)."
            ) from None
    return str(job.job_id)


def job_folder(cfg: Config) -> Path:
    """Where submitit keeps each job's pickles and logs (`%j`: the job id)."""
    return RunPaths(cfg.run_dir).submitit / "%j"


def _python(cfg: Config) -> str:
    """Every task's interpreter starts with the stop signals blocked (see `legato.slurm.startmask`)."""
    return launcher([cfg.slurm.signal, "TERM"] if cfg.slurm.handle_sigterm else [cfg.slurm.signal])


def local_executor(cfg: Config, folder: Path) -> submitit.LocalExecutor:
    """submitit's local executor for this config: its task(s), time limit, signal lead and the GPUs this process sees."""
    executor = submitit.LocalExecutor(folder=folder, python=_python(cfg))
    gpus = visible_gpus()
    executor.update_parameters(
        # Where ranks fork, one task forks them all once it imported torch (legato.orchestrator.local_ranks).
        tasks_per_node=1 if FORKS else cfg.local.tasks,
        timeout_min=cfg.local.timeout_min or NO_LIMIT_MIN,
        signal_delay_s=cfg.slurm.signal_lead_s,
        gpus_per_node=len(gpus),
        visible_gpus=gpus,
    )
    return executor


def visible_gpus() -> tuple[int, ...]:
    """The GPUs this process may use, by index: submitit's LocalExecutor sets CUDA_VISIBLE_DEVICES for its tasks
    to exactly the GPUs it is given (none unless told), so the local job sees what the supervisor sees.

    Read from CUDA_VISIBLE_DEVICES when set (indices only; submitit takes no UUIDs), else from `nvidia-smi -L`,
    never from torch: the supervisor does not import it.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = [item.strip() for item in visible.split(",") if item.strip()]
        if not all(name.isdigit() for name in names):
            log.warning(
                "CUDA_VISIBLE_DEVICES=%s names GPUs by UUID; submitit's local executor takes indices only, so the "
                "local job sees only the indexed ones. Name the GPUs by index to train on all of them.",
                visible,
            )
        return tuple(int(name) for name in names if name.isdigit())
    if shutil.which("nvidia-smi") is None:
        return ()
    listed = run_command(["nvidia-smi", "-L"], timeout=GPU_LIST_TIMEOUT_S)
    return tuple(range(sum(line.startswith("GPU ") for line in (listed.output or "").splitlines())))


def slurm_executor(cfg: Config, folder: Path, exclude: tuple[str, ...]) -> submitit.SlurmExecutor:
    """submitit's SLURM executor for this config, on no node of `exclude` (it needs `srun` on PATH)."""
    executor = submitit.SlurmExecutor(folder=folder, python=_python(cfg))
    executor.update_parameters(**slurm_parameters(cfg, exclude))
    return executor


def slurm_parameters(cfg: Config, exclude: tuple[str, ...]) -> dict:
    """The SLURM executor's parameters for this config, on no node of `exclude` (plain data, no scheduler asked)."""
    s = cfg.slurm
    extra = dict(s.extra_sbatch)
    if exclude:
        # Nodes that failed this run stay out of its later jobs, on top of any the user excluded.
        extra["exclude"] = ",".join(n for n in dict.fromkeys([*str(extra.get("exclude") or "").split(","), *exclude]) if n)
    params: dict = {
        "time": s.time_min,
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        "job_name": cfg.run.name,
        "setup": [*(f"export {name}={shlex.quote(value)}" for name, value in determinism_environ(os.environ).items()), *s.setup],
        # submitit writes its own --signal from a class attribute; ours wins, with the lead we were given.
        "additional_parameters": {"signal": f"{s.signal}@{s.signal_lead_s}", "requeue": True, **extra},
    }
    if s.gpus_per_task:
        params["gpus_per_task"] = s.gpus_per_task
    if s.mem_gb:
        params["mem"] = f"{int(s.mem_gb * 1024)}MB"
    for key in ("partition", "account", "qos"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    return params


@contextlib.contextmanager
def _job_environment(cfg: Config) -> Iterator[None]:
    """The environment the job inherits: strict determinism needs a fixed hash seed and cuBLAS workspace, and the
    local controller sends the configured stop signal at its time limit."""
    wanted = {**determinism_environ(os.environ), "SUBMITIT_PREEMPT_SIGNAL": cfg.slurm.signal}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
