"""The one interface between legato and a scheduler: what any backend must do to run, watch and stop a legato job.

Modelled on submitit's `Executor`: a small abstract base class whose
implementations (`legato.slurm.local.LocalBackend`,
`legato.slurm.cluster.SlurmBackend`, and the tests' fake) each answer every
question the supervisor, the CLI and the job side ask of a scheduler. What
crosses this boundary is plain data (job ids, host names, `JobState`,
`JobPlace`), never a submitit object. This module must NEVER compare an
executor name (that is `legato.slurm.backends.backend_for`'s job alone) and
never import the orchestrator.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from legato.config import Config


@dataclass(frozen=True)
class JobState:
    """The scheduler's word for a job: its state name, whether it may still run, why it waits (if it says), and,
    for a job the scheduler will never start, why and the fix (`blocked`; None while it may still start)."""

    name: str
    active: bool
    reason: str | None = None
    blocked: str | None = None


@dataclass(frozen=True)
class JobPlace:
    """Where one task of a job runs, as the scheduler tells it: the job id, its restart count and its hosts."""

    job_id: str
    restart: int
    hosts: tuple[str, ...]


class Backend(ABC):
    """A scheduler that runs legato jobs: submits, identifies, watches, signals, cancels and requeues them."""

    name: str
    state_poll_interval_s: float
    """How often the supervisor may ask `state`: a /proc read is cheap, an sacct call is not."""
    records_state_changes: bool
    """Whether every change of `state` is worth a `job_state` ledger record (a scheduler queue; not a local process)."""
    signals_task_pids: bool
    """Whether `signal` reaches the tasks through their pids (so every rank must have recorded its pid first)."""
    shares_terminal: bool
    """Whether the job runs in the supervisor's terminal (a Ctrl-C reaches its tasks too)."""
    tasks_die_with_controller: bool
    """Whether a task must end itself when its controller (its parent process) dies."""
    forks_ranks: bool
    """Whether a job's one task forks all the config's ranks (`legato.orchestrator.local_ranks`) instead of each rank
    being a task the scheduler starts."""

    @abstractmethod
    def validate(self, cfg: Config) -> None:
        """Refuse, with a `UsageError` naming the fix in one paragraph, a config this backend cannot run here."""

    @abstractmethod
    def submit(self, cfg: Config, task: Callable[[], Any], exclude: tuple[str, ...] = ()) -> str:
        """Submit one job running `task` on every task of the job, on no node of `exclude`; returns its job id."""

    @abstractmethod
    def identify(self, env: Any, ledger_events: Callable[[], list[dict]]) -> JobPlace:
        """From inside a task: the job's id, restart count and hosts, from submitit's `JobEnvironment` `env`
        (and the run's ledger, read through `ledger_events`, where the scheduler does not count restarts)."""

    @abstractmethod
    def state(self, job_id: str) -> JobState:
        """From outside: the job's state now (UNKNOWN when the scheduler cannot say; `JobHandle` bounds that)."""

    @abstractmethod
    def signal(self, job_id: str, sig: signal.Signals, pids: list[int]) -> None:
        """Deliver `sig` to every task of the job (`pids`: the tasks' pids as the ledger recorded them)."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """End the job and its tasks."""

    @abstractmethod
    def requeue(self, job_id: str) -> str | None:
        """From inside the job (rank 0, after the agreed checkpoint): have the scheduler run it again; returns what
        went wrong, or None."""

    @abstractmethod
    def exit_code_after_requeue(self, code: int) -> int:
        """The exit code a task ends with once `requeue` succeeded (`code`: the trainer's)."""

    @abstractmethod
    def failed_nodes(self, hosts: list[str]) -> dict[str, str]:
        """Those of `hosts` the scheduler reports failed (down, drained, not responding): name -> state."""

    @abstractmethod
    def master_addr(self, hosts: tuple[str, ...]) -> str:
        """Where the ranks of a job on `hosts` meet when the config names no address."""

    @abstractmethod
    def tasks_per_node(self, cfg: Config) -> int:
        """How many of the job's ranks share one machine."""

    @abstractmethod
    def job_environ(self, cfg: Config) -> Mapping[str, str] | None:
        """The environment a task will see that shapes its thread count, or None for this process's own."""
