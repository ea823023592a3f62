"""The job side of the supervisor: what submitit runs on every task of a legato job.

Identity, signals, one trainer rank, its ledger records (`legato.orchestrator.job_events`), environment capture,
requeue. A local job's one task forks its ranks (`legato.orchestrator.local_ranks`), and each runs this same job side.

It takes the stop signal away from submitit (whose own handler acts on rank 0
alone and pickles the job inside the handler), derives rank, world size,
master address and a port from the job id and restart count, runs one trainer
rank, and records in the run's ledger what the rank saw. After a stop at a
committed checkpoint, rank 0 requeues the job (`scontrol requeue` on SLURM,
submitit's requeue exit code locally) and every rank exits at once, so no rank
waits for the scheduler's KillWait. When a rank loses its peers (another
rank's process or node died) and a checkpoint exists, rank 0 records
`rank_lost` instead of a failure and leaves the resubmission to the
supervisor. The stop signals are taken over first thing (tasks start with
them blocked, see `legato.slurm.startmask`), so one that came during start-up
is remembered, not fatal. It must never checkpoint or talk to other
ranks from a signal handler, and never requeue past `slurm.max_requeues`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from legato.config import Config, load_config
from legato.errors import EXIT_OK, EXIT_STOPPED
from legato.events import DECISIONS, Kind
from legato.orchestrator.job_events import JobEvents
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.local_ranks import run_ranks
from legato.orchestrator.status import current_session
from legato.paths import RunPaths
from legato.repro.attempt import capture_and_record
from legato.repro.capture import CaptureRequest
from legato.repro.redact import Redactor, run_key
from legato.runtime.rank_env import RankEnv
from legato.slurm.backends import backend_for
from legato.slurm.local import LOCAL_REQUEUE_EXIT
from legato.store.manifest import checkpoint_step, list_checkpoints, manifest_checksum, read_manifest_file
from legato.system.exiting import end_at_exit
from legato.system.lifeline import die_with_parent
from legato.system.processes import launch_times
from legato.system.threads import resolve_threads

log = logging.getLogger(__name__)

PORT_BASE, PORT_SPAN = 10000, 20000  # below Linux's ephemeral range
DECISION_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Identity:
    """Who this task is, from the scheduler's environment."""

    executor: str
    job_id: str
    restart: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    hosts: tuple[str, ...]

    @property
    def port(self) -> int:
        """Same on every rank, different for every (job, restart): a requeued job never meets a stale store."""
        digest = hashlib.sha256(f"{self.job_id}/{self.restart}".encode()).digest()
        return PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN

    def rank_env(self, master_addr: str | None = None) -> RankEnv:
        """Where the ranks meet: `slurm.master_addr` when set, else this machine (local) or the job's first node."""
        master = master_addr or backend_for(self.executor).master_addr(self.hosts)
        return RankEnv(self.rank, self.world_size, self.local_rank, self.local_world_size, master, self.port)

    def tag(self) -> dict:
        return {"job_id": self.job_id, "restart": self.restart}


def identify(ledger: Ledger) -> Identity:
    """This task's identity, from submitit's job environment as the job's backend reads it."""
    env = submitit.JobEnvironment()
    place = backend_for(env.cluster).identify(env, ledger.read)
    per_node = max(1, env.num_tasks // max(1, env.num_nodes))
    return Identity(env.cluster, place.job_id, place.restart, env.global_rank, env.num_tasks, env.local_rank, per_node, place.hosts)


@dataclass(frozen=True)
class TrainTask:
    """What submitit pickles: the captured config and the attempts already spent before this job."""

    config_path: str
    attempts_before: int
    command: tuple[str, ...] = ()  # the (redacted) command line that started the run

    def __call__(self) -> dict:
        cfg = load_config(self.config_path)
        forked = _ranks_to_fork(cfg)
        if not forked:
            return self._as_the_rank(cfg)
        die_with_parent()  # the local task dies with its controller (LocalBackend.tasks_die_with_controller), and its ranks with it
        task = os.getpid()
        code = run_ranks(forked, _stop_signals(cfg), lambda: self.rank(cfg, task), LOCAL_REQUEUE_EXIT)
        end_at_exit(code)  # after submitit wrote the result: no teardown of the torch this task imported for its ranks
        if code:
            sys.exit(code)
        return {"final_global_hash": _final_hash(Ledger(cfg.run_dir).read())}

    def _as_the_rank(self, cfg: Config) -> dict:
        """This task is the rank (SLURM starts one task per rank): it ends at its exit with the rank's code, after
        submitit wrote the result, without tearing down the torch it trained with (about a second of CPU between the
        checkpoint a stop committed and the job's end). An exception ends it as the interpreter would."""
        try:
            result = self.rank(cfg, os.getpid())
        except SystemExit as stop:
            if isinstance(stop.code, int):  # the rank's own codes; None or a message the interpreter's exit reads itself
                end_at_exit(stop.code)
            raise
        end_at_exit(EXIT_OK)
        return result

    def rank(self, cfg: Config, task: int) -> dict:
        """One rank of the job, in the task of pid `task` or forked from it: returns when it finished training, exits
        with the job's code otherwise."""
        from legato.runtime.job import run_rank  # the job trains; the supervisor that pickles this task never imports torch

        _take_signals(cfg)
        ledger = Ledger(cfg.run_dir)
        ident = identify(ledger)
        if backend_for(ident.executor).tasks_die_with_controller:
            die_with_parent()
        rank_env = ident.rank_env(cfg.slurm.master_addr)
        if ident.rank == 0:
            fields = {
                "executor": ident.executor,
                "hosts": list(ident.hosts),
                "world_size": ident.world_size,
                "master_addr": rank_env.master_addr,
                **launch_times(os.environ, task),
            }
            ledger.append(Kind.ATTEMPT_STARTED, **ident.tag(), **fields)
        ledger.append(Kind.RANK_STARTED, **ident.tag(), rank=ident.rank, host=socket.gethostname(), pid=os.getpid())
        if ident.local_rank == 0 and cfg.repro.enabled:
            _capture_environment(cfg, ledger, ident, self.command)
        events = JobEvents(ledger, ident.tag(), ident.rank, RunPaths(cfg.run_dir).progress)
        code = run_rank(cfg, rank_env, on_event=events)
        if code == EXIT_OK:
            if ident.rank == 0:
                ledger.append(Kind.FINISHED, **ident.tag(), step=events.last_step, final_global_hash=events.final_hash)
            return {"final_global_hash": events.final_hash}
        decision = _decide(cfg, ledger, ident, code, events, self.attempts_before) if ident.rank == 0 else _await_decision(ledger, ident)
        sys.exit(_exit_code(ident, decision, code))


def _capture_environment(cfg: Config, ledger: Ledger, ident: Identity, command: tuple[str, ...]) -> None:
    """Rank 0 of each node records this node's environment for this attempt; a failure is logged, never fatal."""
    node = int(os.environ.get("SLURM_NODEID", "0") or 0)
    dest = RunPaths(cfg.run_dir).capture(ident.job_id, ident.restart, node)
    request = CaptureRequest(
        dest,
        Redactor.from_config(cfg, run_key(RunPaths(cfg.run_dir).repro)),
        cfg.repro.command_timeout_s,
        config=cfg.to_dict(),
        argv=("job:", *sys.argv, "run started by:", *command),
        code_paths=_code_paths(cfg),
        labels={"job_id": ident.job_id, "attempt": ident.restart, "node": node, "executor": ident.executor},
        threads=resolve_threads(cfg.determinism.threads, ident.local_world_size).describe(),
    )
    capture_and_record(request, node, lambda kind, **fields: ledger.append(kind, **ident.tag(), **fields))


def _code_paths(cfg: Config) -> tuple[Path, ...]:
    if cfg.train.entrypoint is None:
        return ()
    try:
        spec = importlib.util.find_spec(cfg.train.entrypoint.partition(":")[0])
    except (ImportError, ValueError):
        return ()
    return (Path(spec.origin).parent,) if spec and spec.origin else ()


def _ranks_to_fork(cfg: Config) -> int:
    """How many ranks this task forks: the local executor starts one task for all the config's ranks
    (`legato.orchestrator.local_ranks`), SLURM starts each rank as a task of its own (0: this task is a rank)."""
    env = submitit.JobEnvironment()
    return cfg.local.tasks if backend_for(env.cluster).forks_ranks and env.num_tasks < cfg.local.tasks else 0


def _final_hash(events: list[dict]) -> str | None:
    return next((e.get("final_global_hash") for e in reversed(events) if e["event"] == Kind.FINISHED), None)


def _stop_signals(cfg: Config) -> tuple[signal.Signals, ...]:
    """The signals that stop a rank of this config: the configured one, and SIGTERM when it is handled."""
    from legato.dist.stop import parse_signal, stop_signals  # torch: the supervisor imports this module too

    return tuple(parse_signal(name) for name in stop_signals(cfg.slurm.signal, cfg.slurm.handle_sigterm))


def _take_signals(cfg: Config) -> None:
    """Undo submitit's job-side handlers (its stop handler must not run the show, and SIGTERM should end a task),
    and take the stop signals: a stop signal held since the task started is remembered from here on."""
    from legato.dist.stop import StopFlag  # torch: the supervisor imports this module too

    stops = _stop_signals(cfg)
    submitit_signal = submitit.JobEnvironment._usr_sig()
    if submitit_signal not in stops:
        signal.signal(submitit_signal, signal.SIG_IGN)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    if signal.SIGTERM not in stops:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    StopFlag(stops).install()  # the trainer's own flags take over from it and inherit a signal it caught


def _decide(cfg: Config, ledger: Ledger, ident: Identity, code: int, events: JobEvents, attempts_before: int) -> str:
    """Rank 0: requeue after a stop within budget; otherwise record why the job ends here."""
    tag = {**ident.tag(), "last_step": events.last_step}
    if _cancel_requested(ledger.read()):
        # The user's cancel ended this attempt; whoever cancelled records the end. Recording FAILED here raced the
        # supervisor's `cancelled` and, when it won, named a cancelled run failed.
        return Kind.CANCELLED
    resumable = _newest_checkpoint_step(cfg) if code != EXIT_STOPPED and events.peer_lost else None
    if resumable is not None:
        # Another rank (its process or its node) died: not this run's fault; the supervisor resubmits within the budget.
        reason = f"a rank lost its peers ({(events.error or '').splitlines()[0][:200]})"
        ledger.append(Kind.RANK_LOST, **tag, exit_code=code, reason=reason, checkpoint_step=resumable)
        return Kind.RANK_LOST
    if code != EXIT_STOPPED:
        reason = events.error or f"rank 0 exited with code {code}; see `legato logs {cfg.run_dir}`"
        ledger.append(Kind.FAILED, **tag, exit_code=code, reason=reason)
        return Kind.FAILED
    spent = attempts_before + ident.restart
    if spent >= cfg.slurm.max_requeues:
        reason = (
            f"requeue budget exhausted: {spent} interruptions so far and slurm.max_requeues is {cfg.slurm.max_requeues}; "
            f"the newest checkpoint is at step {events.last_step}. Raise slurm.max_requeues or the time limit, then run again."
        )
        ledger.append(Kind.FAILED, **tag, exit_code=code, reason=reason)
        return Kind.FAILED
    problem = backend_for(ident.executor).requeue(ident.job_id)
    if problem:
        ledger.append(Kind.REQUEUE_FAILED, **tag, reason=problem)
        return Kind.REQUEUE_FAILED
    ledger.append(Kind.REQUEUED, **tag, budget_left=cfg.slurm.max_requeues - spent - 1)
    return Kind.REQUEUED


def _newest_checkpoint_step(cfg: Config) -> int | None:
    """The step of the newest published checkpoint whose manifest is intact (the next job verifies its files)."""
    for path in list_checkpoints(RunPaths(cfg.run_dir).checkpoints):
        try:
            found = read_manifest_file(path)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("manifest_sha256") == manifest_checksum(found):
            return checkpoint_step(path)
    return None


def _await_decision(ledger: Ledger, ident: Identity) -> str:
    """Other ranks: wait for rank 0's requeue decision, so the job never ends before its requeue lands."""
    deadline = time.monotonic() + DECISION_TIMEOUT_S
    while time.monotonic() < deadline:
        events = ledger.read()
        if _cancel_requested(events):
            return Kind.CANCELLED
        for e in reversed(events):
            if e["event"] in DECISIONS and e.get("job_id") == ident.job_id and e.get("restart") == ident.restart:
                return e["event"]
        time.sleep(0.1)
    log.warning("rank %d: no decision from rank 0 within %.0fs; exiting", ident.rank, DECISION_TIMEOUT_S)
    return Kind.REQUEUE_FAILED


def _cancel_requested(events: list[dict]) -> bool:
    """True when `legato cancel` asked to end the run's current session (`events`: the whole ledger)."""
    return any(e["event"] == Kind.CANCEL_REQUESTED for e in current_session(events))


def _exit_code(ident: Identity, decision: str, code: int) -> int:
    if decision == Kind.REQUEUED:
        return backend_for(ident.executor).exit_code_after_requeue(code)
    if decision == Kind.FAILED and code == EXIT_STOPPED:
        return 1
    return code
