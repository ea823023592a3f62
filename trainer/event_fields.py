"""The fields of every kind of record in the event vocabulary (`legato.events.Kind`): one TypedDict per kind, and the
job tag that ties a record to one attempt. Readers and writers name a kind's fields through `FIELDS` and
`field_names`, never by listing them again. This module must never do I/O, import torch, or import
`legato.orchestrator` or `legato.slurm`: every package reads it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from legato.events import Kind


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
    """The fields of a `RESUBMITTED` record: the new job, the one it replaces, and why; the ended job's nodes SLURM reports
    failed (node -> state), those left out on suspicion (node -> why, `slurm.exclude_suspect_nodes`), and every node
    the new job excludes."""

    job_id: str
    previous_job_id: str
    reason: str | None
    attempts_before: int
    failed_nodes: dict[str, str]
    suspect_nodes: dict[str, str]
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


class _Launched(TypedDict, total=False):
    launched_at: float  # when rank 0's process started (Unix time): its imports and process group are the attempt's start-up
    ends_at: float  # when the scheduler ends the job (SLURM_JOB_END_TIME): the time limit a stop keeps its margin to


class AttemptStarted(_Attempt, _Launched):
    """The fields of an `ATTEMPT_STARTED` record: where and how wide the attempt runs, and when it was launched and ends."""

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


class _Background(TypedDict, total=False):
    background: bool  # written by the asynchronous writer while the loop trained on: `seconds` did not block it


class CheckpointCommitted(_Attempt, _Diverged, _ReplaysFrom, _Background):
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
    # {"step", "components", "how"} when the run went on past an earlier resume that did not verify (the checkpoint's
    # `unverified` mark): this resume is verified from that step on, not from the run's start; None otherwise
    unverified: dict[str, Any] | None
    # the names of the objects the census found unsaved in this run so far (this attempt's start included): the resume is
    # verified without them; None when there are none
    unregistered: list[str] | None
    # the newer checkpoints passed over because they did not verify (a corrupt or missing file), each as "step_N: why";
    # None when the newest was resumed; absent from records written before it was recorded
    skipped: list[str] | None


class ContinuedUnverified(_Attempt):
    """The fields of a `CONTINUED_UNVERIFIED` record: the step the run went on from, the differing components, the choice."""

    step: int
    components: list[str]
    how: str  # "LEGATO_RESUME=unverified" or "checkpoint.verify: warn"


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

    Each object is {"kind", "type", "where", "size", "ranks"}; `when` is "start", "early" (the attempt's first steps) or
    the checkpoint's reason.
    """

    step: int
    when: str
    objects: list[dict[str, Any]]
    strict: bool
    names: list[str]  # the variable paths of the state among them ("losses_m", "saver"): what a resume verifies without


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


class LoopLeft(_Attempt):
    """The fields of a `LOOP_LEFT` record: the step the loop was left after, the newest checkpoint's step (where the next
    launch resumes; None before the first), and the exception out of the Session's step that left it ("RuntimeError: ...";
    None for a `break`, and for an exception in the loop's body, which closes the loop's generator as a break does)."""

    step: int
    total_steps: int
    checkpoint_step: int | None
    exception: str | None


class WorkLost(_Attempt):
    """The fields of a `WORK_LOST` record: the checkpoint's step this attempt resumed, the last step an earlier attempt
    had logged past it, and the steps between them (trained, lost, and trained again)."""

    step: int
    trained_to: int
    lost_steps: int


class CheckpointInterval(_Attempt):
    """The fields of a `CHECKPOINT_INTERVAL` record (legato.session.spacing): the interval in minutes, the checkpoint cost
    it came from (None before one was measured), the mean time between failures estimated from the `failures` the
    ledger records over `run_hours`, and Young-Daly's value before the bounds (None before a measured cost)."""

    minutes: float
    cost_s: float | None
    mtbf_hours: float
    failures: int
    run_hours: float
    young_daly_minutes: float | None


class Hang(_Attempt):
    """The fields of a `HANG` record: the rank that found it and its host, the step and phase it stood at, how long no rank
    had shown progress against the bound, its main thread's innermost frame and the script's own line, the processes of
    its host found stopped, the ranks of other hosts that never answered (rank -> host), the folder of the stacks
    (relative to the run directory), and whether the same hang (step and frame) ended an earlier attempt."""

    rank: int
    host: str
    step: int
    phase: str
    quiet_s: float
    bound_s: float
    frame: str
    user_frame: str | None
    stopped: list[str]
    silent: dict[str, str]
    stacks: str
    repeated: bool


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


FIELDS: dict[Kind, type[Any]] = {
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
    Kind.CONTINUED_UNVERIFIED: ContinuedUnverified,
    Kind.REPLAY_STOPPED: ReplayStopped,
    Kind.BUCKET_LAYOUT: BucketLayout,
    Kind.UNSAVED_STATE: UnsavedState,
    Kind.FINISHED: Finished,
    Kind.FAILED: Failed,
    Kind.RANK_LOST: RankLost,
    Kind.REQUEUE_FAILED: RequeueFailed,
    Kind.REQUEUED: Requeued,
    Kind.ATTEMPT_STOPPED: AttemptStopped,
    Kind.LOOP_LEFT: LoopLeft,
    Kind.HANG: Hang,
    Kind.WORK_LOST: WorkLost,
    Kind.CHECKPOINT_INTERVAL: CheckpointInterval,
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
