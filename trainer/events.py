"""The event vocabulary: every kind of record in a run's ledger, and the trainer's reports that feed it, typed.

A ledger line is one JSON object: `{"event": <Kind value>, "time": <unix s>, **fields}`, with
the fields of its kind below. `Kind` is str-valued: the file format is the strings themselves.
`NOT_IN_LEDGER` are reports to a callback (the trainer's, the supervisor's CLI)
that never land in the ledger as such. The Session's records (checkpoints,
resumes, replays, bucket layouts, unsaved state) carry `rank` too, and reach
the ledger with a job tag (or, from a script's own Session, its attempt:
`legato.recorder`). Groupings readers need are defined here, once. This
module must never do I/O, import torch, or import `legato.orchestrator` or
`legato.slurm`: every package reads it.
"""

from __future__ import annotations

import enum
from typing import Any, TypedDict


class Kind(str, enum.Enum):
    """One kind of event; the value is the string in the ledger's "event" field."""

    # The supervisor (`legato run`), once per session of the run directory, before anything is submitted.
    RUN_STARTED = "run_started"
    # The supervisor, after it submitted the session's first job.
    SUBMITTED = "submitted"
    # The supervisor, after a job ended without requeuing itself and a new job was submitted to resume.
    RESUBMITTED = "resubmitted"
    # The supervisor, when the scheduler's state of the current job changes.
    JOB_STATE = "job_state"
    # The supervisor, when the scheduler's reason for keeping the current job pending changes (squeue's %r).
    PENDING_REASON = "pending_reason"
    # `legato cancel`, before it asks the scheduler to cancel the job.
    CANCEL_REQUESTED = "cancel_requested"
    # `legato cancel` or the supervisor, once a cancelled run has ended: terminal.
    CANCELLED = "cancelled"
    # The supervisor under `chaos.preempt_every_s`, after it sent the stop signal to every task.
    PREEMPT_SENT = "preempt_sent"
    # The supervisor, after it cancelled a job still running once the run had ended.
    LEFTOVER_CANCEL = "leftover_cancel"
    # The supervisor, after it cancelled a job whose other tasks outlived a lost rank's grace period.
    LOST_RANK_CANCEL = "lost_rank_cancel"
    # Rank 0's job side, when an attempt (a job, or one of its requeues) starts.
    ATTEMPT_STARTED = "attempt_started"
    # Every rank's job side, when its process starts.
    RANK_STARTED = "rank_started"
    # Each node's local rank 0, after capturing the node's environment.
    REPRO_CAPTURED = "repro_captured"
    # Each node's local rank 0, when the environment capture failed (never fatal).
    REPRO_FAILED = "repro_failed"
    # Every rank's job side, when the ranks agreed to stop after a stop signal reached it.
    STOP_SIGNAL = "stop_signal"
    # The Session (rank 0 has the global hash), after a checkpoint was published; written on by rank 0's job side.
    CHECKPOINT_COMMITTED = "checkpoint_committed"
    # The Session (rank 0), when a checkpoint could not be written (a full disk, a quota): the ones before it stand.
    CHECKPOINT_FAILED = "checkpoint_failed"
    # The Session, after it restored a checkpoint and checked the restored state (and its replay).
    RESUMED = "resumed"
    # The Session, when the ranks stopped during a replay (the checkpoint being replayed still stands).
    REPLAY_STOPPED = "replay_stopped"
    # The Session, at its first step: whether DDP's gradient bucket layout is pinned.
    BUCKET_LAYOUT = "bucket_layout"
    # The Session, when its census found stateful objects no registered component saves (an EMA model, a generator...).
    UNSAVED_STATE = "unsaved_state"
    # Rank 0's job side, after training completed (the Session reports it where an attempt finds the run done): terminal.
    FINISHED = "finished"
    # Rank 0's job side or the supervisor, when the run cannot go on: terminal.
    FAILED = "failed"
    # Rank 0's job side, when a rank lost its peers and a checkpoint exists: the supervisor resubmits.
    RANK_LOST = "rank_lost"
    # Rank 0's job side, when `scontrol requeue` failed.
    REQUEUE_FAILED = "requeue_failed"
    # Rank 0's job side, after a stop at a committed checkpoint, when the job requeued itself.
    REQUEUED = "requeued"
    # A script's Session (rank 0), when its ranks stopped at a committed checkpoint (exit 75): the launcher runs it again.
    ATTEMPT_STOPPED = "attempt_stopped"
    # The Session (rank 0), every few seconds: the live step and loss. Goes to progress.json, never the ledger.
    PROGRESS = "progress"
    # The Session, on every rank, when the ranks agreed to stop. The job side records it as `STOP_SIGNAL`.
    STOP_AGREED = "stop_agreed"
    # `run_rank`, when its rank failed. The job side keeps the message for the `FAILED` or `RANK_LOST` record.
    ERROR = "error"
    # The supervisor, on every poll while the current job waits in the queue: why and for how long. The live line, never the ledger.
    WAITING = "waiting"

    # As the plain string in text, like `enum.StrEnum` (Python >= 3.11): f"{kind}" is "resumed".
    __str__ = str.__str__
    __format__ = str.__format__


SCRIPT_EXECUTOR = "script"
"""The `executor` of an `ATTEMPT_STARTED` that a script's own Session recorded (its launcher, not `legato run`, relaunches it)."""

TERMINAL = (Kind.FINISHED, Kind.FAILED, Kind.CANCELLED)
"""The kinds that end a session of the run directory (the run's state is then named after the kind)."""

ATTEMPT_ENDING = (Kind.REQUEUED, Kind.REQUEUE_FAILED, Kind.ATTEMPT_STOPPED, Kind.FINISHED, Kind.FAILED)
"""The kinds that end one attempt of a job (rank 0's job side recorded how it ended)."""

DECISIONS = (Kind.REQUEUED, Kind.REQUEUE_FAILED, Kind.FAILED, Kind.RANK_LOST)
"""Rank 0's decision at the end of an attempt that did not finish, which the other ranks wait for."""

JOB_SUBMISSIONS = (Kind.SUBMITTED, Kind.RESUBMITTED)
"""The kinds that name a newly submitted job (its `job_id`)."""

NOT_IN_LEDGER = (Kind.PROGRESS, Kind.STOP_AGREED, Kind.ERROR, Kind.WAITING)
"""The trainer's reports to its callback (and the supervisor's to its CLI) that are never ledger records themselves."""


class _Attempt(TypedDict, total=False):
    """The job tag of a record written by a job's task, or by a script's Session for its attempt (`legato.session.identity`)."""

    job_id: str
    restart: int


JOB_TAG_FIELDS = frozenset(_Attempt.__annotations__)
"""The fields that tie a record to one attempt of a job."""


class RunStarted(TypedDict):
    """The fields of a `RUN_STARTED` record: the run as `legato run` started it."""

    command: list[str]
    executor: str
    world_size: int
    total_steps: int | None
    config_digest: str
    max_requeues: int


class Submitted(TypedDict):
    """The fields of a `SUBMITTED` record: the session's first job."""

    job_id: str
    executor: str
    config_digest: str


class Resubmitted(TypedDict):
    """The fields of a `RESUBMITTED` record: the new job, the one it replaces, and why."""

    job_id: str
    previous_job_id: str
    reason: str | None
    attempts_before: int
    failed_nodes: dict[str, str]
    excluded: list[str]


class JobState(TypedDict):
    """The fields of a `JOB_STATE` record: the scheduler's new state of the current job."""

    job_id: str
    state: str


class PendingReason(TypedDict):
    """The fields of a `PENDING_REASON` record: the scheduler's new reason for keeping the current job pending."""

    job_id: str
    reason: str


class Waiting(TypedDict):
    """The fields of a `WAITING` report: the pending job, the scheduler's reason (None before it gives one), seconds waited."""

    job_id: str
    reason: str | None
    waited_s: float


class CancelRequested(TypedDict):
    """The fields of a `CANCEL_REQUESTED` record: the job `legato cancel` asks to cancel."""

    job_id: str


class Cancelled(TypedDict):
    """The fields of a `CANCELLED` record: the cancelled job and why."""

    job_id: str
    reason: str


class PreemptSent(TypedDict):
    """The fields of a `PREEMPT_SENT` record: the attempt the supervisor sent the stop signal, and which signal."""

    job_id: str
    restart: int
    signal: str


class LeftoverCancel(TypedDict):
    """The fields of a `LEFTOVER_CANCEL` record: the job still running after the run ended."""

    job_id: str


class LostRankCancel(TypedDict):
    """The fields of a `LOST_RANK_CANCEL` record: the attempt cancelled after a lost rank's grace period."""

    job_id: str
    restart: int
    grace_s: float


class AttemptStarted(_Attempt):
    """The fields of an `ATTEMPT_STARTED` record: where and how wide the attempt runs."""

    executor: str
    hosts: list[str]
    world_size: int
    master_addr: str


class RankStarted(_Attempt):
    """The fields of a `RANK_STARTED` record: one rank's host and process id."""

    rank: int
    host: str
    pid: int


class ReproCaptured(_Attempt):
    """The fields of a `REPRO_CAPTURED` record: one node's environment capture, where it is and what failed."""

    node: int
    path: str
    seconds: float
    failures: dict[str, str]
    sections: dict[str, str]


class ReproFailed(_Attempt):
    """The fields of a `REPRO_FAILED` record: the node whose capture failed, and why."""

    node: int
    reason: str


class StopSignal(_Attempt):
    """The fields of a `STOP_SIGNAL` record: the step the ranks agreed to stop at, and when the signal came."""

    rank: int
    step: int
    received_at: float
    at_start: bool


class _Diverged(TypedDict, total=False):
    """Ranks whose replicated state differed from the copy written for every rank (legato.state.recipes)."""

    diverged: dict[str, list[str]]  # rank -> its tensors that differed; a resume from the checkpoint cannot verify it


class _ReplaysFrom(TypedDict, total=False):
    """A checkpoint that holds its state as the replay of the steps since an earlier checkpoint (a stop's, under verify
    "error"): it writes only those steps' records, and its resume replays them from that one."""

    replays_from: int  # the earlier checkpoint's step


class CheckpointCommitted(_Attempt, _Diverged, _ReplaysFrom):
    """The fields of a `CHECKPOINT_COMMITTED` record: the published checkpoint's step, hash, cost (bytes written) and reason."""

    step: int
    global_hash: str
    seconds: float
    bytes: int
    reason: str


class CheckpointFailed(_Attempt):
    """The fields of a `CHECKPOINT_FAILED` record: the checkpoint that could not be written (its step and reason), each
    failing rank's error, the newest checkpoint that stands (None: none), and the paragraph said to the user."""

    step: int
    reason: str
    errors: dict[str, str]
    standing: int | None
    message: str


def resharded_label(resharded: dict[str, int]) -> str:
    """How a resharded resume is shown everywhere (log, status, verify): not a bitwise continuation."""
    return f"resharded {resharded['from']} -> {resharded['to']} ranks: data position exact, not bitwise"


class Resumed(_Attempt):
    """The fields of a `RESUMED` record: the restored step, the expected and recomputed hashes, the replay, and any resharding."""

    step: int
    expected_hash: str
    recomputed_hash: str
    match: bool
    mismatches: dict[str, list[str]]
    replay: dict[str, Any] | None
    seconds: float  # the resume's total time: choosing the checkpoint, verifying and loading it, and the replay
    # {"from": N, "to": M} ranks on a resume of a checkpoint of another world size (checkpoint.reshard), else None;
    # absent from records written before resharding existed
    resharded: dict[str, int] | None


class ReplayStopped(_Attempt):
    """The fields of a `REPLAY_STOPPED` record: the step a replay stopped at and the checkpoint that still stands."""

    step: int
    checkpoint_step: int


class BucketLayout(_Attempt):
    """The fields of a `BUCKET_LAYOUT` record: whether DDP's gradient bucket layout is pinned, and why."""

    step: int
    pinned: bool
    reason: str


class UnsavedState(_Attempt):
    """The fields of an `UNSAVED_STATE` record: the objects legato does not save, when they were found, and whether refused.

    Each object is {"kind", "type", "where", "size", "ranks"}; `when` is "start" or the checkpoint's reason.
    """

    step: int
    when: str
    objects: list[dict[str, Any]]
    strict: bool


class Finished(_Attempt):
    """The fields of a `FINISHED` record: the last step and the final global hash."""

    step: int
    final_global_hash: str | None


class _Ended(TypedDict, total=False):
    """How far an attempt got; the supervisor's own `FAILED` records name only the job."""

    restart: int
    last_step: int


class Failed(_Ended):
    """The fields of a `FAILED` record: the job, its exit code and why."""

    job_id: str
    exit_code: int
    reason: str


class RankLost(_Ended):
    """The fields of a `RANK_LOST` record: the job, its exit code, why, and the checkpoint to resubmit from."""

    job_id: str
    exit_code: int
    reason: str
    checkpoint_step: int


class RequeueFailed(_Ended):
    """The fields of a `REQUEUE_FAILED` record: the job and why `scontrol requeue` failed."""

    job_id: str
    reason: str


class Requeued(_Ended):
    """The fields of a `REQUEUED` record: the job and the requeues left in its budget."""

    job_id: str
    budget_left: int


class AttemptStopped(_Attempt):
    """The fields of an `ATTEMPT_STOPPED` record: the step of the committed checkpoint the script's next launch resumes from."""

    step: int


class Progress(TypedDict):
    """The fields of a `PROGRESS` report: the live step, epoch and loss (to progress.json, never the ledger)."""

    rank: int
    step: int
    total_steps: int | None
    epoch: int
    loss: float | None


class StopAgreed(TypedDict, total=False):
    """The fields of a `STOP_AGREED` report: the step the ranks agreed to stop at."""

    rank: int
    step: int
    signal_received_at: float | None
    at_start: bool


class Error(TypedDict, total=False):
    """The fields of an `ERROR` report: the failed rank's message and exit code, and whether it lost its peers."""

    rank: int
    message: str
    exit_code: int
    peer_lost: bool


FIELDS: dict[Kind, type] = {
    Kind.RUN_STARTED: RunStarted,
    Kind.SUBMITTED: Submitted,
    Kind.RESUBMITTED: Resubmitted,
    Kind.JOB_STATE: JobState,
    Kind.PENDING_REASON: PendingReason,
    Kind.CANCEL_REQUESTED: CancelRequested,
    Kind.CANCELLED: Cancelled,
    Kind.PREEMPT_SENT: PreemptSent,
    Kind.LEFTOVER_CANCEL: LeftoverCancel,
    Kind.LOST_RANK_CANCEL: LostRankCancel,
    Kind.ATTEMPT_STARTED: AttemptStarted,
    Kind.RANK_STARTED: RankStarted,
    Kind.REPRO_CAPTURED: ReproCaptured,
    Kind.REPRO_FAILED: ReproFailed,
    Kind.STOP_SIGNAL: StopSignal,
    Kind.CHECKPOINT_COMMITTED: CheckpointCommitted,
    Kind.CHECKPOINT_FAILED: CheckpointFailed,
    Kind.RESUMED: Resumed,
    Kind.REPLAY_STOPPED: ReplayStopped,
    Kind.BUCKET_LAYOUT: BucketLayout,
    Kind.UNSAVED_STATE: UnsavedState,
    Kind.FINISHED: Finished,
    Kind.FAILED: Failed,
    Kind.RANK_LOST: RankLost,
    Kind.REQUEUE_FAILED: RequeueFailed,
    Kind.REQUEUED: Requeued,
    Kind.ATTEMPT_STOPPED: AttemptStopped,
    Kind.PROGRESS: Progress,
    Kind.STOP_AGREED: StopAgreed,
    Kind.ERROR: Error,
    Kind.WAITING: Waiting,
}
"""Each kind's fields (besides "event" and "time"), as a TypedDict."""


def field_names(kind: Kind) -> frozenset[str]:
    """Every field a record of `kind` may carry (required and optional)."""
    spec = FIELDS[kind]
    return spec.__required_keys__ | spec.__optional_keys__
