"""A fake scheduler for fast unit tests of the supervisor's logic: no submitit, no processes, no SLURM.

In the spirit of submitit's own tests (a mocked sbatch and sacct): each submitted
job follows a script of `Step`s, one step per `state` call, and a step writes
into the run's ledger what the job's rank 0 would have written (attempt
started, requeued, rank lost, finished...). The supervisor, given this backend,
makes its real decisions (resubmit, requeue budget, lost-rank cancel, leftover
cancel, finished or failed) in-process in milliseconds. The real schedulers are
tested beside it, in tests/test_slurm.py, tests/test_multinode.py and the local
end-to-end tests; this fake must never stand in for them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from legato.config import Config
from legato.orchestrator.ledger import Ledger
from legato.slurm.backend import Backend, JobPlace, JobState


@dataclass(frozen=True)
class Step:
    """What a job looks like for one `state` call: the scheduler's state and the ledger events its ranks write
    as the step begins (each event a dict with "event"; job_id is filled in)."""

    state: str
    active: bool = True
    reason: str | None = None
    events: tuple[dict, ...] = ()
    blocked: str | None = None


def pending(reason: str = "Resources") -> Step:
    """Waiting in the queue, saying why."""
    return Step("PENDING", reason=reason)


def never_starts(reason: str, why: str) -> Step:
    """Pending for a reason the scheduler can never clear (`why`: the explanation and fix the backend gives)."""
    return Step("PENDING", reason=reason, blocked=why)


def running(restart: int = 0, hosts: tuple[str, ...] = ("n1",), *events: dict) -> Step:
    """An attempt starts training (rank 0 records it), then writes `events`."""
    started = {"event": "attempt_started", "restart": restart, "hosts": list(hosts), "world_size": len(hosts)}
    return Step("RUNNING", events=(started, *events))


def still(state: str = "RUNNING", *events: dict) -> Step:
    """No change in state; the job writes `events`."""
    return Step(state, events=events)


def ended(state: str, *events: dict) -> Step:
    """The job is gone from the queue (COMPLETED, FAILED, NODE_FAIL...), after writing `events`."""
    return Step(state, active=False, events=events)


@dataclass
class FakeBackend(Backend):
    """Runs scripted jobs: the n-th `submit` gets the n-th script; its last step repeats for ever."""

    ledger: Ledger
    scripts: list[list[Step]]
    broken_nodes: dict[str, str] = field(default_factory=dict)
    submitted: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    signalled: list[tuple[str, str]] = field(default_factory=list)
    _steps: dict[str, list[Step]] = field(default_factory=dict)

    name = "fake"
    state_poll_interval_s = 0.0
    records_state_changes = True
    signals_task_pids = False
    shares_terminal = False
    tasks_die_with_controller = False
    forks_ranks = False

    def validate(self, cfg: Config) -> None:
        """The fake runs any config."""

    def submit(self, cfg: Config, task: Callable[[], Any], exclude: tuple[str, ...] = ()) -> str:
        """The next script becomes job 101, 102, ...; `task` is never run."""
        job_id = str(101 + len(self.submitted))
        self.submitted.append((job_id, tuple(exclude)))
        self._steps[job_id] = list(self.scripts[len(self.submitted) - 1])
        return job_id

    def identify(self, env: Any, ledger_events: Callable[[], list[dict]]) -> JobPlace:
        """Never called: the fake's jobs have no tasks."""
        raise AssertionError("a fake job has no tasks to identify")

    def state(self, job_id: str) -> JobState:
        """The job's next scripted step (its events land in the ledger first); a cancelled job is CANCELLED."""
        if job_id in self.cancelled:
            return JobState("CANCELLED", False)
        steps = self._steps[job_id]
        step = steps.pop(0)
        if not steps:
            steps.append(Step(step.state, step.active, step.reason, blocked=step.blocked))  # the last step repeats, writing nothing again
        for event in step.events:
            self.ledger.append(event["event"], job_id=job_id, **{k: v for k, v in event.items() if k != "event"})
        return JobState(step.state, step.active, step.reason, step.blocked)

    def signal(self, job_id: str, sig: signal.Signals, pids: list[int]) -> None:
        """Recorded, nothing delivered."""
        self.signalled.append((job_id, sig.name))

    def cancel(self, job_id: str) -> None:
        """The job reads CANCELLED from now on."""
        self.cancelled.append(job_id)

    def requeue(self, job_id: str) -> str | None:
        """A script writes its own `requeued` events; nothing to ask."""
        return None

    def exit_code_after_requeue(self, code: int) -> int:
        """Like SLURM: the exit code does not matter."""
        return code

    def failed_nodes(self, hosts: list[str]) -> dict[str, str]:
        """Those of `hosts` the test declared broken."""
        return {h: s for h, s in self.broken_nodes.items() if h in hosts}

    def master_addr(self, hosts: tuple[str, ...]) -> str:
        """The first host."""
        return hosts[0]

    def tasks_per_node(self, cfg: Config) -> int:
        """As on SLURM."""
        return cfg.slurm.tasks_per_node

    def job_environ(self, cfg: Config) -> Mapping[str, str] | None:
        """This process's own."""
        return None
