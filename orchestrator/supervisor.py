"""The supervisor: submit the job, stay attached, and carry the run to its end.

A job normally carries itself across stops (rank 0 requeues it after the
agreed checkpoint). The supervisor handles what a job cannot: when a job ends
without having requeued itself (a hard kill, a node failure, a rank that lost
its peers, no `scontrol`, a local controller out of restarts), it submits a
new job that resumes from the newest verified checkpoint, within the same
requeue budget. It reads the
run only through the ledger and the progress file the job writes, reports
every new event and progress reading to a callback (the CLI formats them),
and returns the run's exit code: 0 only when training finished and every
resume verified. `chaos.preempt_every_s` has it deliver the real stop signal
to the job's tasks, for demos and tests. A resubmission excludes (`--exclude`) the
ended job's nodes that SLURM reports failed, with `slurm.exclude_suspect_nodes`
the node where it hung or a rank was persistently slower (legato.orchestrator.suspects),
and every node excluded earlier in the session, and records them in the ledger. It must never submit while another
supervisor holds the run directory (the caller holds the lock).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from legato.config import Config, training_identity
from legato.errors import EXIT_FAILED, UsageError
from legato.events import ATTEMPT_ENDING, TERMINAL, Kind, hang_label, repeated_hang_reason
from legato.orchestrator.jobside import TrainTask
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.status import current_job, current_session, read_progress, session_exit_code
from legato.orchestrator.suspects import suspect_nodes, suspected_before, within_budget
from legato.orchestrator.waiting import PENDING, waiting_job
from legato.slurm.backend import Backend, JobState
from legato.slurm.backends import backend_for
from legato.slurm.jobs import JobHandle
from legato.system.signals import parse_signal

log = logging.getLogger(__name__)

Notify = Callable[[str, dict], None]
LOST_RANK_GRACE_S = 60.0  # after `rank_lost` or a `hang`, how long the job's other tasks get to exit by themselves
# After the run's last record, how long the supervisor waits for its job to end: the job still writes into the run
# directory (submitit's result file, the tasks' last log lines) as it ends, a second or two after the record.
JOB_END_WAIT_S = 60.0


def config_digest(cfg: Config) -> str:
    """What identifies the training a run directory belongs to (the same rule `preflight.check_compatible` applies)."""
    text = json.dumps(training_identity(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def start_session(cfg: Config, ledger: Ledger, command: list[str]) -> None:
    """Record the intent to run (with the redacted command line); whichever supervisor holds the lock submits the first job."""
    ledger.append(
        Kind.RUN_STARTED,
        command=command,
        executor=cfg.executor,
        world_size=cfg.world_size,
        total_steps=cfg.train.steps,
        config_digest=config_digest(cfg),
        max_requeues=cfg.slurm.max_requeues,
    )


class Supervisor:
    """Drives one run directory's current session to its end (see the module docstring).

    `backend` is the scheduler it submits to and watches: by default the one the config's executor names; tests
    pass a fake to script a job's life without one.
    """

    def __init__(self, cfg: Config, config_path: Path, notify: Notify, poll_s: float = 0.5, backend: Backend | None = None) -> None:
        self.cfg = cfg
        self.backend = backend or backend_for(cfg.executor)
        self.config_path = config_path
        self.notify = notify
        self.poll_s = poll_s
        self.ledger = Ledger(cfg.run_dir)
        # Report the current session only: earlier sessions of the run directory are history.
        events = self.ledger.read()
        self._seen = len(events) - len(current_session(events))
        self._progress_time: float | None = None
        self._preempted: set[tuple[str, int]] = set()
        self._first_progress: dict[tuple[str, int], float] = {}
        self._handles: dict[str, JobHandle] = {}
        self._state: tuple[str, JobState, float] | None = None
        self._lost_since: dict[tuple[str, int], float] = {}
        self._lost_cancelled: set[tuple[str, int]] = set()
        self._reasons: dict[str, str] = {}
        self._cancelled: set[str] = set()

    def run(self) -> int:
        """Watch (and when needed submit) until the current session ends; returns the run's exit code."""
        while True:
            session = self._report_new()
            code = session_exit_code(session)
            if code is not None:
                self._cancel_leftover_job(session)
                self._await_job_end(session)
                return code
            job_id = current_job(session)
            if job_id is None:
                self._submit(session, previous=None, reason=None)
                continue
            handle = self._handle(job_id)
            self._preempt(session, handle)
            self._end_after_lost_rank(session, handle)
            state = self._job_state(handle)
            if state.blocked:
                self._end_blocked(handle, state)
                continue
            if not state.active:
                self._after_job_end(handle, state.name)
                continue
            time.sleep(self.poll_s)

    def skip_history(self) -> list[dict]:
        """Report only what happens from now on; returns the session so far (for the caller to summarise)."""
        events = self.ledger.read()
        self._seen = len(events)
        return current_session(events)

    def follow(self, supervised_elsewhere: Callable[[], bool]) -> int | None:
        """Report a run another supervisor drives; its exit code at the end, or None once that supervisor is gone."""
        while supervised_elsewhere():
            code = session_exit_code(self._report_new())
            if code is not None:
                return code
            time.sleep(self.poll_s)
        return None

    def cancel(self) -> None:
        """Stop the current job and record the run as cancelled (Ctrl-C of an attached local run)."""
        session = current_session(self.ledger.read())
        job_id = current_job(session)
        if job_id is not None:
            self.backend.cancel(job_id)
        self.ledger.append(Kind.CANCELLED, job_id=job_id, reason="cancelled by the user")
        self._report_new()

    # -- internals ------------------------------------------------------

    def _report_new(self) -> list[dict]:
        events = self.ledger.read()
        for event in events[self._seen :]:
            self.notify("event", event)
        self._seen = len(events)
        progress = read_progress(self.cfg.run_dir)
        if progress and progress.get("time") != self._progress_time:
            self._progress_time = progress.get("time")
            self.notify(Kind.PROGRESS, progress)
        session = current_session(events)
        waiting = waiting_job(session, time.time())
        if waiting is not None:
            self.notify(Kind.WAITING, waiting)
        return session

    def _handle(self, job_id: str) -> JobHandle:
        if job_id not in self._handles:
            self._handles[job_id] = JobHandle(self.backend, job_id)
        return self._handles[job_id]

    def _job_state(self, handle: JobHandle) -> JobState:
        """The job's state, asked of the scheduler at most every few seconds; changes go to the ledger."""
        now = time.monotonic()
        if self._state and self._state[0] == handle.job_id and now - self._state[2] < self.backend.state_poll_interval_s:
            return self._state[1]
        state = handle.state()
        previous = self._state[1].name if self._state and self._state[0] == handle.job_id else None
        self._state = (handle.job_id, state, now)
        if self.backend.records_state_changes and state.name != previous:
            self.ledger.append(Kind.JOB_STATE, job_id=handle.job_id, state=state.name)
        if self.backend.records_state_changes and state.name == PENDING and state.reason not in (None, self._reasons.get(handle.job_id)):
            self._reasons[handle.job_id] = state.reason
            self.ledger.append(Kind.PENDING_REASON, job_id=handle.job_id, reason=state.reason)
        return state

    def _end_blocked(self, handle: JobHandle, state: JobState) -> None:
        """A job the scheduler can never start ends the run now (exit 1, the reason and the fix), not after hours in the queue."""
        handle.cancel()
        self._cancelled.add(handle.job_id)
        self._fail(
            handle.job_id,
            f"job {handle.job_id} can never start: {self.backend.name} keeps it pending with reason "
            f"{state.reason}, and {state.blocked} Job {handle.job_id} was cancelled; run `legato run` "
            "again once the config is fixed.",
        )

    def _fail(self, job_id: str, reason: str) -> None:
        """The run ends failed (exit 1) because of job `job_id`, for `reason`: one paragraph that names the fix."""
        self.ledger.append(Kind.FAILED, job_id=job_id, exit_code=EXIT_FAILED, reason=reason)

    def _after_job_end(self, handle: JobHandle, state: str) -> None:
        session = self._report_new()
        if session_exit_code(session) is not None:
            return
        if any(e["event"] == Kind.CANCEL_REQUESTED for e in session):
            self.ledger.append(Kind.CANCELLED, job_id=handle.job_id, reason=f"cancelled by the user (job ended {state})")
            return
        started = [e for e in session if e["event"] == Kind.ATTEMPT_STARTED and e.get("job_id") == handle.job_id]
        if not started:
            self._fail(
                handle.job_id,
                f"job {handle.job_id} ended ({state}) before any of its tasks started training; see `legato logs {self.cfg.run_dir}`",
            )
            return
        hangs = [e for e in session if e["event"] == Kind.HANG and e.get("job_id") == handle.job_id]
        if hangs and hangs[-1]["repeated"]:
            self._fail(handle.job_id, repeated_hang_reason(hangs[-1]))
            return
        lost = [e for e in session if e["event"] == Kind.RANK_LOST and e.get("job_id") == handle.job_id]
        reason = f"{state}: {hang_label(hangs[-1])}" if hangs else f"{state}: {lost[-1]['reason']}" if lost else state
        self._submit(session, previous=handle.job_id, reason=reason)

    def _submit(self, session: list[dict], previous: str | None, reason: str | None) -> None:
        attempts = sum(1 for e in session if e["event"] == Kind.ATTEMPT_STARTED)
        if previous is not None and attempts - 1 >= self.cfg.slurm.max_requeues:
            self._fail(
                previous,
                f"requeue budget exhausted: job {previous} ended ({reason}) after {attempts - 1} interruptions "
                f"and slurm.max_requeues is {self.cfg.slurm.max_requeues}. Raise it, then run `legato run` "
                "again to continue.",
            )
            return
        failed = self._failed_nodes(session, previous)
        suspects = self._suspects(session, previous)
        excluded = sorted(_excluded(session) | set(failed) | set(suspects))
        task = TrainTask(str(self.config_path), attempts, _command(session))
        try:
            job_id = self.backend.submit(self.cfg, task, exclude=tuple(excluded))
        except UsageError as exc:
            if not excluded:
                raise
            # Too few nodes left without them: better to wait for a node to return than to end the run.
            log.warning("sbatch refused the job without %s (%s); submitting without the exclusion", ",".join(excluded), exc)
            excluded, suspects = [], {}
            job_id = self.backend.submit(self.cfg, task)
        if previous is None:
            self.ledger.append(Kind.SUBMITTED, job_id=job_id, executor=self.cfg.executor, config_digest=config_digest(self.cfg))
        else:
            self.ledger.append(
                Kind.RESUBMITTED,
                job_id=job_id,
                previous_job_id=previous,
                reason=reason,
                attempts_before=attempts,
                failed_nodes=failed,
                suspect_nodes=suspects,
                excluded=excluded,
            )

    def _failed_nodes(self, session: list[dict], previous: str | None) -> dict[str, str]:
        """The ended job's nodes that the scheduler now reports failed (down, drained, not responding): name -> state."""
        if previous is None:
            return {}
        hosts = [
            h for e in session if e["event"] == Kind.ATTEMPT_STARTED and str(e.get("job_id")) == str(previous) for h in e.get("hosts", [])
        ]
        return self.backend.failed_nodes(list(dict.fromkeys(hosts)))

    def _suspects(self, session: list[dict], previous: str | None) -> dict[str, str]:
        """The ended job's nodes to leave out on suspicion (slurm.exclude_suspect_nodes, within its budget): node -> why."""
        if previous is None or not self.cfg.slurm.exclude_suspect_nodes or self.cfg.executor != "slurm":
            return {}
        found = suspect_nodes(self.cfg.run_dir, session, previous)
        return within_budget(found, suspected_before(session), self.cfg.slurm.max_suspect_nodes)

    def _preempt(self, session: list[dict], handle: JobHandle) -> None:
        """chaos.preempt_every_s: send the stop signal once per attempt, that many seconds after it began training.

        Counting from the first progress of the attempt, not from its start, guarantees progress
        between preemptions however slowly a loaded machine starts the ranks."""
        every = self.cfg.chaos.preempt_every_s
        if not every:
            return
        live = _live_attempt(session)
        if live is None:
            return
        key = (str(live["job_id"]), live["restart"])
        if key in self._preempted or time.time() - self._training_since(key) < every:
            return
        pids = [e["pid"] for e in session if e["event"] == Kind.RANK_STARTED and (str(e.get("job_id")), e.get("restart")) == key]
        if self.backend.signals_task_pids and len(pids) < live.get("world_size", 1):
            return
        self._preempted.add(key)
        handle.signal_tasks(parse_signal(self.cfg.slurm.signal), pids)
        self.ledger.append(Kind.PREEMPT_SENT, job_id=key[0], restart=key[1], signal=self.cfg.slurm.signal)

    def _cancel_leftover_job(self, session: list[dict]) -> None:
        """A run that failed while its job still runs (rank 0 refused a setting during start-up while the other ranks
        wait for it in a collective) would leave those ranks waiting until the collective timeout: cancel the job."""
        job_id = current_job(session)
        ends = [e["event"] for e in session if e["event"] in TERMINAL]
        if job_id is None or ends[-1] != Kind.FAILED or job_id in self._cancelled:
            return
        handle = self._handle(job_id)
        if not handle.state().active:
            return
        self.ledger.append(Kind.LEFTOVER_CANCEL, job_id=job_id)
        handle.cancel()

    def _await_job_end(self, session: list[dict]) -> None:
        """Return once the session's job has ended, so that nothing writes into the run directory after `legato run`
        returns (a user's next command may copy or remove it); a job still running after JOB_END_WAIT_S is left to
        its scheduler, with a warning. The scheduler is asked directly, not through `_job_state`: its state records
        belong before the run's last record, not after it."""
        job_id = current_job(session)
        if job_id is None:
            return
        handle = self._handle(job_id)
        deadline = time.monotonic() + JOB_END_WAIT_S
        while handle.state().active:
            if time.monotonic() >= deadline:
                log.warning("job %s still runs %.0f s after the run ended; leaving it to %s", job_id, JOB_END_WAIT_S, self.backend.name)
                return
            time.sleep(max(self.poll_s, self.backend.state_poll_interval_s))

    def _end_after_lost_rank(self, session: list[dict], handle: JobHandle) -> None:
        """A job attempt whose rank 0 recorded `rank_lost`, or whose watchdog recorded a `hang`, has nothing left to do;
        one task hanging on its way out (a half-dead collective, an exit handler, a stopped rank on another node) must
        not hold the run: cancel the job after a grace period. An attempt SLURM itself requeued and restarted is live
        again: only the job's newest attempt counts."""
        live = _live_attempt(session)
        if live is None or str(live["job_id"]) != handle.job_id:
            return
        key = (handle.job_id, live["restart"])
        lost = any(e["event"] in (Kind.RANK_LOST, Kind.HANG) and (str(e.get("job_id")), e.get("restart")) == key for e in session)
        if not lost or key in self._lost_cancelled:
            return
        since = self._lost_since.setdefault(key, time.monotonic())
        if time.monotonic() - since < LOST_RANK_GRACE_S:
            return
        self._lost_cancelled.add(key)
        self.ledger.append(Kind.LOST_RANK_CANCEL, job_id=handle.job_id, restart=live["restart"], grace_s=LOST_RANK_GRACE_S)
        handle.cancel()

    def _training_since(self, key: tuple[str, int]) -> float:
        """When the supervisor first saw progress from this attempt (infinitely late while it has none)."""
        if key not in self._first_progress:
            progress = read_progress(self.cfg.run_dir)
            if not progress or (str(progress.get("job_id")), progress.get("restart")) != key:
                return float("inf")
            self._first_progress[key] = time.time()
        return self._first_progress[key]


def _command(session: list[dict]) -> tuple[str, ...]:
    started = [e for e in session if e["event"] == Kind.RUN_STARTED]
    return tuple(started[-1].get("command", ())) if started else ()


def _excluded(session: list[dict]) -> set[str]:
    """Nodes already excluded in this session: a node that failed the run once stays out of its later jobs."""
    return {n for e in session if e["event"] == Kind.RESUBMITTED for n in e.get("excluded", ())}


def _live_attempt(session: list[dict]) -> dict | None:
    started = [e for e in session if e["event"] == Kind.ATTEMPT_STARTED]
    if not started:
        return None
    last = started[-1]
    key = (last.get("job_id"), last.get("restart"))
    ended = any(e["event"] in ATTEMPT_ENDING and (e.get("job_id"), e.get("restart")) == key for e in session)
    return None if ended else last
