"""What a run's ledger says happened: attempts, resumes, how each attempt ended, the run's state.

Pure functions from ledger events (and the live progress file, and the ranks' pace files) to plain
dataclasses; `legato status`, `legato watch` and the supervisor's exit code
all read the run through here. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_RESUME_MISMATCH, EXIT_USAGE
from legato.events import JOB_SUBMISSIONS, SCRIPT_EXECUTOR, TERMINAL, Kind, loop_left_label
from legato.orchestrator import goodput
from legato.orchestrator.goodput import Spent
from legato.orchestrator.stragglers import Straggler, read_pace, stragglers
from legato.paths import RunPaths
from legato.voice import counted

SUBMITTED = Kind.SUBMITTED.value  # the run's state from `legato run` until its first attempt starts
LEFT_EARLY = "ended early"  # a script's run whose loop was left before its end (it resumes when run again)
NOT_VERIFIED = "resume not verified"  # how an attempt whose resume failed its verification ended


@dataclass
class Attempt:
    """One attempt of a run (one restart of one job) as its ledger events tell it."""

    number: int
    job_id: str
    restart: int | None  # None only where a ledger's record carries no job tag
    hosts: list[str]
    world_size: int
    started_at: float
    resumed_from_step: int | None = None
    verified: bool | None = None
    expected_hash: str | None = None
    recomputed_hash: str | None = None
    resharded: dict | None = None  # {"from": N, "to": M}: resumed on another world size (checkpoint.reshard), not bitwise
    replay: dict | None = None  # from_step, steps, identical, first_divergence, seconds (or stopped_at: a stop during the replay)
    last_step: int = 0
    ended: str = "running"
    stop_signal_step: int | None = None
    checkpoint_seconds: list[float] = field(default_factory=list)
    resume_seconds: float | None = None  # the resume's total time, its replay included
    continued_unverified: bool = False  # its resume did not verify, and the run went on by the user's choice
    unregistered: list[str] = field(default_factory=list)  # what its resume verified without: objects the census found unsaved
    skipped: list[str] = field(default_factory=list)  # newer checkpoints its resume passed over, "step_N: why" (did not verify)
    lost_steps: int = 0  # steps it trained past the checkpoint the next attempt resumed: lost, and trained again
    environment: dict[str, str] = field(default_factory=dict, repr=False)
    environment_changed: list[str] | None = None
    spent: Spent = field(default_factory=Spent)  # where its time went (legato.orchestrator.goodput)
    stragglers: list[Straggler] = field(default_factory=list)  # its ranks slower than the others (legato.orchestrator.stragglers)

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.job_id, self.restart)

    @property
    def steps_run(self) -> int:
        return max(0, self.last_step - (self.resumed_from_step or 0))

    @property
    def replay_text(self) -> str:
        """How this attempt's replay went, for people: "replay ✓ 4 steps in 0.52s", "replay ✗ at step 9", or "-"."""
        r = self.replay
        if not r:
            return "-"
        if "stopped_at" in r:
            return f"replay stopped at step {r['stopped_at']}"
        if r.get("identical"):
            # The replay's own time; ledgers before it was recorded lack it.
            took = f" in {r['seconds']:.2f}s" if isinstance(r.get("seconds"), (int, float)) else ""
            return f"replay ✓ {counted(r['steps'], 'step')}{took}"
        return f"replay ✗ at step {(r.get('first_divergence') or {}).get('step')}"


@dataclass
class RunSummary:
    """What `legato status` reports of a run: its state, progress, and every attempt."""

    run_dir: str
    state: str
    finished: bool
    final_global_hash: str | None
    failure: str | None
    total_steps: int | None
    step: int
    attempts: list[Attempt]
    job_id: str | None
    requeues: int
    resubmissions: int
    excluded_nodes: list[str] = field(default_factory=list)
    unverified: dict | None = None  # the run went on past a resume that did not verify: step, components, how
    unregistered: list[str] = field(default_factory=list)  # what the census found unsaved in the run, by variable path
    spent: Spent = field(default_factory=Spent)  # the attempts' buckets added up: goodput and the rest

    @property
    def lost_steps(self) -> int:
        """Steps trained and lost across the run (each trained again by a later attempt)."""
        return sum(a.lost_steps for a in self.attempts)

    @property
    def all_resumes_verified(self) -> bool:
        return all(a.verified for a in self.attempts if a.resumed_from_step is not None)

    def to_json(self) -> dict:
        data = asdict(self)
        for attempt, raw in zip(self.attempts, data["attempts"]):
            raw["steps_run"] = attempt.steps_run
            raw["spent"] = attempt.spent.to_json()
            raw["stragglers"] = [s.to_json() for s in attempt.stragglers]
            del raw["environment"]
        data["spent"] = self.spent.to_json()
        data["all_resumes_verified"] = self.all_resumes_verified
        data["lost_steps"] = self.lost_steps
        return data


def current_session(events: list[dict]) -> list[dict]:
    """Events since the newest `legato run` (a run directory can be run again after a failure)."""
    starts = [i for i, e in enumerate(events) if e["event"] == Kind.RUN_STARTED]
    return events[starts[-1] :] if starts else events


def current_job(events: list[dict]) -> str | None:
    """The job id of the run's newest submission, or None when nothing was submitted."""
    jobs = [e["job_id"] for e in events if e["event"] in JOB_SUBMISSIONS]
    return jobs[-1] if jobs else None


def read_progress(run_dir: Path) -> dict | None:
    """The run's live progress file, or None when it is missing or unreadable."""
    try:
        return json.loads(RunPaths(run_dir).progress.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def summarize(run_dir: Path, events: list[dict], progress: dict | None = None) -> RunSummary:
    """Fold a run's ledger events (and its live progress) into a RunSummary."""
    attempts: dict[tuple[str, int | None], Attempt] = {}
    state, failure, final_hash, total = SUBMITTED, None, None, None
    requeues = resubmissions = 0
    captures: list[dict] = []
    excluded: list[str] = []
    unverified: dict | None = None
    unregistered: set[str] = set()
    for e in events:
        kind, key = e["event"], (str(e.get("job_id")), e.get("restart"))
        attempt = attempts.get(key)
        if kind == Kind.RUN_STARTED:
            state, failure, total, excluded = SUBMITTED, None, e.get("total_steps"), []
        elif kind == Kind.ATTEMPT_STARTED:
            # An attempt of the same job that recorded no end was requeued by SLURM itself (a node failure).
            _end_open(attempts, key[0], "ended, killed" if e.get("executor") == SCRIPT_EXECUTOR else "ended, requeued by SLURM")
            attempt = Attempt(len(attempts) + 1, key[0], key[1], e.get("hosts", []), e.get("world_size", 0), e["time"])
            attempts[key] = attempt
            state = "running"
        elif kind == Kind.RESUBMITTED:
            resubmissions += 1
            excluded = sorted(set(excluded) | set(e.get("excluded", ())))
            _end_open(attempts, e.get("previous_job_id"), f"ended ({e.get('reason')}), resubmitted")
        elif kind in TERMINAL:
            state = kind
            failure = e.get("reason") if kind != Kind.FINISHED else None
            final_hash = e.get("final_global_hash", final_hash)
        elif kind == Kind.LOOP_LEFT:
            state, failure = loop_left(e)
        elif kind == Kind.RESUMED and not e["match"]:
            state, failure = Kind.FAILED, not_verified(e)  # until a continuation says the run went on by choice
        elif kind == Kind.CONTINUED_UNVERIFIED:
            state, failure = "running", None
        elif kind == Kind.WORK_LOST and attempt is not None:
            _charge_lost_work(attempts, attempt, e["lost_steps"])
        if kind in (Kind.RESUMED, Kind.UNSAVED_STATE):
            unregistered.update(e.get("unregistered") or e.get("names") or [])
        if kind in (Kind.RESUMED, Kind.CONTINUED_UNVERIFIED):
            unverified = unverified or e.get("unverified") or (e if kind == Kind.CONTINUED_UNVERIFIED else None)
        if kind == Kind.REPRO_CAPTURED:
            captures.append(e)  # another node's capture can be written before rank 0 records the attempt
            continue
        if attempt is None:
            continue
        _apply(attempt, e)
        requeues += kind == Kind.REQUEUED
    if progress and (str(progress.get("job_id")), progress.get("restart")) in attempts:
        live = attempts[(str(progress["job_id"]), progress["restart"])]
        live.last_step = max(live.last_step, int(progress.get("step") or 0))
        total = total or progress.get("total_steps")
    for e in captures:
        if (str(e.get("job_id")), e.get("restart")) in attempts:
            _apply_capture(attempts[(str(e.get("job_id")), e.get("restart"))], e)
    ordered = sorted(attempts.values(), key=lambda a: a.number)
    _mark_environment_changes(ordered)
    if state in TERMINAL:
        for attempt in ordered:
            if attempt.ended == "running":
                attempt.ended = "ended"
    step = max((a.last_step for a in ordered), default=0)
    spent = _account_time(ordered, events, progress)
    for attempt in ordered:
        attempt.stragglers = stragglers(read_pace(run_dir, attempt.job_id, attempt.number))
    return RunSummary(
        str(run_dir),
        state,
        state == Kind.FINISHED,
        final_hash,
        failure,
        total,
        step,
        ordered,
        current_job(events),
        requeues,
        resubmissions,
        excluded,
        None if unverified is None else {k: unverified.get(k) for k in ("step", "components", "how")},
        sorted(unregistered),
        spent,
    )


def not_verified(e: dict) -> str:
    """Why a run failed at a resume that did not verify (a `RESUMED` record with no match), and the two ways on."""
    replay = e.get("replay") or {}
    first = replay.get("first_divergence") if not replay.get("identical", True) else None
    mismatches = "; ".join(f"rank {r}: {', '.join(n)}" for r, n in (e.get("mismatches") or {}).items())
    what = (
        (f"restored state differs ({mismatches})" if mismatches else "")
        + ("; " if mismatches and first else "")
        + (f"replay diverged first at step {first['step']} on rank {first['rank']}: {first.get('cause')}" if first else "")
    )
    return (
        f"{NOT_VERIFIED} at step {e['step']}: {what or 'the state hash differs'}. Fix the cause (the rank's log names it) and "
        "run the same command again, or go on deliberately from this checkpoint with LEGATO_RESUME=unverified (recorded; the "
        "run then no longer claims bitwise continuity with its start)"
    )


def loop_left(e: dict) -> tuple[str, str]:
    """The run's state and reason after a script left its loop early: failed (an exception out of the Session's step, a
    loader's among them), or ended early (a `break`, or an exception in the loop's body, which the Session cannot see)."""
    return (Kind.FAILED if e.get("exception") else LEFT_EARLY), loop_left_label(e)


def _apply(attempt: Attempt, e: dict) -> None:
    kind = e["event"]
    attempt.last_step = max(attempt.last_step, int(e.get("step") or e.get("last_step") or 0))
    if kind == Kind.RESUMED:
        attempt.ended = "running" if e["match"] else NOT_VERIFIED
        attempt.resumed_from_step = e["step"]
        attempt.verified = bool(e["match"])
        attempt.resharded = e.get("resharded")
        attempt.expected_hash, attempt.recomputed_hash = e["expected_hash"], e["recomputed_hash"]
        attempt.replay = e.get("replay")
        attempt.unregistered = list(e.get("unregistered") or [])
        attempt.skipped = list(e.get("skipped") or [])
        _apply_resume_time(attempt, e)
    elif kind == Kind.REPLAY_STOPPED:
        attempt.replay = {"stopped_at": e["step"], "checkpoint_step": e["checkpoint_step"]}
    elif kind == Kind.CHECKPOINT_COMMITTED:
        attempt.checkpoint_seconds.append(e["seconds"])
    elif kind == Kind.STOP_SIGNAL and attempt.stop_signal_step is None:
        attempt.stop_signal_step = e["step"]
    elif kind == Kind.CHECKPOINT_FAILED and e.get("reason") == "final":
        attempt.ended = "ended unsaved: final checkpoint not written"
    elif kind == Kind.ATTEMPT_STOPPED:
        attempt.ended = "stopped"  # a script's attempt, at a committed checkpoint: its launcher runs it again
    elif kind == Kind.LOOP_LEFT:
        exception = e.get("exception")
        attempt.ended = f"raised {exception.split(':')[0]}" if exception else "left the loop"
    elif kind == Kind.REQUEUE_FAILED:
        attempt.ended = f"not requeued: {e.get('reason')}"
    elif kind == Kind.HANG:
        attempt.ended = f"hung at step {e['step']} (stacks in {e['stacks']}/)"
    elif kind == Kind.CONTINUED_UNVERIFIED:
        attempt.ended, attempt.continued_unverified = "running", True
    elif kind in (Kind.REQUEUED, Kind.FINISHED, Kind.FAILED):
        attempt.ended = kind  # the attempt's end is named after its kind


def _apply_resume_time(attempt: Attempt, e: dict) -> None:
    """The resume's total time (choosing, verifying and loading the checkpoint, and the replay); ledgers before it lack it."""
    attempt.resume_seconds = e.get("seconds")


def _apply_capture(attempt: Attempt, e: dict) -> None:
    """Node 0's sections under their own names (as a one-node job has them), node N's as "nodeN/<section>"."""
    prefix = f"node{e['node']}/" if e.get("node") else ""
    attempt.environment.update({prefix + name: digest for name, digest in e.get("sections", {}).items()})


def _mark_environment_changes(attempts: list[Attempt]) -> None:
    """Name the capture sections, on every node, in which each attempt's environment differs from the previous attempt's."""
    for before, after in zip(attempts, attempts[1:]):
        if before.environment and after.environment:
            names = sorted(set(before.environment) | set(after.environment))
            after.environment_changed = [n for n in names if before.environment.get(n) != after.environment.get(n)]


def _account_time(attempts: list[Attempt], events: list[dict], progress: dict | None) -> Spent:
    """Each attempt's buckets (`Attempt.spent`), in order, each from the end of the one before; their sum for the run."""
    by_key: dict[tuple[str, int | None], list[dict]] = {}
    for e in events:
        by_key.setdefault((str(e.get("job_id")), e.get("restart")), []).append(e)
    if progress and isinstance(progress.get("time"), (int, float)):
        by_key.setdefault((str(progress.get("job_id")), progress.get("restart")), []).append({**progress, "event": Kind.PROGRESS})
    total = Spent()
    since = goodput.run_start(events)
    clocks = [_clock(attempt, by_key.get(attempt.key, [])) for attempt in attempts]
    launches: list[float | None] = [clock.launched for clock in clocks[1:]] + [None]
    for attempt, clock, next_launch in zip(attempts, clocks, launches):
        attempt.spent, since = goodput.attempt_spent(
            clock, clock.launched if since is None else since, attempt.lost_steps, attempt.steps_run, next_launch
        )
        total.add(attempt.spent)
    margins = [a.spent.margin_s for a in attempts if a.spent.margin_s is not None]
    total.margin_s = min(margins) if margins else None  # the closest a stop came to its time limit
    return total


def _clock(attempt: Attempt, records: list[dict]) -> goodput.AttemptClock:
    """What an attempt's records say of its time, launched when rank 0's process started (else when it was recorded)."""
    started = next((r for r in records if r["event"] == Kind.ATTEMPT_STARTED), {})
    return goodput.AttemptClock(float(started.get("launched_at") or attempt.started_at), records)


def _charge_lost_work(attempts: dict[tuple[str, int | None], Attempt], resuming: Attempt, steps: int) -> None:
    """The steps a resume found trained past its checkpoint were the previous attempt's."""
    previous = next((a for a in attempts.values() if a.number == resuming.number - 1), None)
    if previous is not None:
        previous.lost_steps += steps


def _end_open(attempts: dict[tuple[str, int | None], Attempt], job_id: str | None, how: str) -> None:
    for attempt in attempts.values():
        if attempt.job_id == str(job_id) and attempt.ended == "running":
            attempt.ended = how


def session_exit_code(session: list[dict]) -> int | None:
    """The run's exit code once its current session ended, else None."""
    ends = [e for e in session if e["event"] in TERMINAL]
    if not ends:
        return None
    end = ends[-1]
    if end["event"] == Kind.FINISHED:
        verified = all(e["match"] for e in session if e["event"] == Kind.RESUMED)
        return EXIT_OK if verified else EXIT_RESUME_MISMATCH
    if end["event"] == Kind.FAILED and end.get("exit_code") in (EXIT_USAGE, EXIT_RESUME_MISMATCH):
        return end["exit_code"]
    return EXIT_FAILED
