"""The event vocabulary: every kind of record in a run's ledger, and the trainer's reports that feed it.

A ledger line is one JSON object: `{"event": <Kind value>, "time": <unix s>, **fields}`, with
the fields of its kind (typed in `legato.event_fields`). `Kind` is str-valued: the file format is the strings themselves.
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
    # The Session (rank 0 in the ledger), when the run goes on past a resume that did not verify, by the user's choice
    # (LEGATO_RESUME=unverified, or checkpoint.verify: warn): its step, the differing components, and how it was chosen.
    CONTINUED_UNVERIFIED = "continued_unverified"
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
    # A script's Session (rank 0), when the script left the loop before the run's end with no stop agreed: a `break`
    # (early stopping), or an exception. The steps after the newest checkpoint are not saved.
    LOOP_LEFT = "loop_left"
    # The Session (rank 0), when an attempt starts where an earlier one had trained past the checkpoint it resumes (a
    # kill, a hang, a lost rank): the steps trained after that checkpoint, which were lost and are trained again.
    WORK_LOST = "work_lost"
    # The Session (rank 0) under `checkpoint.every_minutes: auto`: the periodic interval it chose by Young-Daly and from
    # what (the measured checkpoint cost, the failures the ledger records), at the attempt's start and when it moves.
    CHECKPOINT_INTERVAL = "checkpoint_interval"
    # The hang watchdog of the rank that first found its attempt hung (no rank stepped, moved or computed for longer than
    # the bound): where it stood, which processes were stopped, which ranks of other hosts never answered, and where the
    # stacks are. The attempt ends (exit 124) and resumes from its newest checkpoint, unless the same hang repeated
    # (`repeated`): then the run fails naming it.
    HANG = "hang"
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

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


SCRIPT_EXECUTOR = "script"
"""The `executor` of an `ATTEMPT_STARTED` that a script's own Session recorded (its launcher, not `legato run`, relaunches it)."""

TERMINAL = (Kind.FINISHED, Kind.FAILED, Kind.CANCELLED)
"""The kinds that end a session of the run directory (the run's state is then named after the kind)."""

ATTEMPT_ENDING = (Kind.REQUEUED, Kind.REQUEUE_FAILED, Kind.ATTEMPT_STOPPED, Kind.LOOP_LEFT, Kind.FINISHED, Kind.FAILED)
"""The kinds that end one attempt of a job (rank 0's job side recorded how it ended)."""

DECISIONS = (Kind.REQUEUED, Kind.REQUEUE_FAILED, Kind.FAILED, Kind.RANK_LOST)
"""Rank 0's decision at the end of an attempt that did not finish, which the other ranks wait for."""

JOB_SUBMISSIONS = (Kind.SUBMITTED, Kind.RESUBMITTED)
"""The kinds that name a newly submitted job (its `job_id`)."""

NOT_IN_LEDGER = (Kind.PROGRESS, Kind.STOP_AGREED, Kind.ERROR, Kind.WAITING)
"""The trainer's reports to its callback (and the supervisor's to its CLI) that are never ledger records themselves."""


def resharded_label(resharded: dict[str, int]) -> str:
    """How a resharded resume is shown everywhere (log, status, verify): not a bitwise continuation."""
    return f"resharded {resharded['from']} -> {resharded['to']} ranks: data position exact, not bitwise"


def unverified_label(mark: dict) -> str:
    """How a continuation past a resume that did not verify (a `CONTINUED_UNVERIFIED` record, or the mark a later checkpoint
    carries) is told everywhere: its step, the components that differed, and the choice that made it."""
    components = ", ".join(mark.get("components") or []) or "the replay"
    return f"continued unverified at step {mark['step']}: {components} ({mark.get('how')})"


def except_label(unregistered: list[str] | None) -> str:
    """What a verified resume verified without, told everywhere: ", except 2 unregistered objects: ema, saver" (or "")."""
    if not unregistered:
        return ""
    noun = "object" if len(unregistered) == 1 else "objects"
    return f", except {len(unregistered)} unregistered {noun}: {', '.join(unregistered)}"


def loop_left_label(record: dict) -> str:
    """How a `LOOP_LEFT` record is told everywhere (rank 0's voice, status, watch): how the loop was left, and what the
    next launch resumes."""
    since = "the start" if record.get("checkpoint_step") is None else f"the checkpoint at step {record['checkpoint_step']}"
    unsaved = f"the steps since {since} are not saved, and running the script again resumes from there"
    if record.get("exception"):
        return f"the script raised {record['exception']} after step {record['step']}; {unsaved}"
    how = "a break, or an exception in its body"
    return f"the script left the loop after step {record['step']} of {record['total_steps']} ({how}); {unsaved}"


def stuck_in_own_code(summary: dict) -> bool:
    """Whether a hang summary or record names a rank whose main thread is stuck in the user's own code (a deadlock, an
    endless wait of its own) rather than waiting in a library for the others."""
    return summary.get("user_frame") is not None and summary.get("user_frame") == summary.get("frame")


def hang_label(record: dict) -> str:
    """How a `HANG` record is told everywhere (status, watch, the supervisor's reason): where the attempt stood, for how
    long nothing moved, where the main thread waited, who was stopped, and where the stacks are."""
    where = record.get("user_frame") or record.get("frame")
    stopped = f"; stopped: {', '.join(record['stopped'])}" if record.get("stopped") else ""
    silent = record.get("silent") or {}
    stopped += "".join(f"; no answer from rank {rank} on {host}" for rank, host in sorted(silent.items(), key=lambda item: int(item[0])))
    return (
        f"hung at step {record['step']} (phase: {record['phase']}): no rank made progress for {record['quiet_s']:.0f}s "
        f"(bound {record['bound_s']:.0f}s); rank {record['rank']} on {record['host']} waited in {where}{stopped}; "
        f"stacks in {record['stacks']}/"
    )


def interval_label(record: dict) -> str:
    """How a `CHECKPOINT_INTERVAL` record is told: the interval, and what Young-Daly chose it from."""
    seen = f"{record['failures']} seen in {record['run_hours']:.1f} h"
    if record.get("cost_s") is None:
        return f"periodic checkpoints every {record['minutes']:g} min until one is measured (every_minutes: auto; {seen})"
    bounded = "" if record["young_daly_minutes"] == record["minutes"] else f", bounded from {record['young_daly_minutes']:.1f}"
    return (
        f"periodic checkpoints every {record['minutes']:.1f} min (every_minutes: auto, Young-Daly{bounded}): a checkpoint "
        f"blocks {record['cost_s']:.2f}s, one failure every {record['mtbf_hours']:.1f} h expected ({seen})"
    )


def repeated_hang_reason(record: dict) -> str:
    """Why a run ends at a hang that an earlier attempt already hung at (same step, same frame): one paragraph."""
    return (
        f"the attempt {hang_label(record)}, exactly where an earlier attempt hung, so running it again would hang the "
        "same way. Read the stacks, fix what they show (a deadlock, a peer that never joins a collective, a stuck data "
        "source) or, if the step is only slow, raise hang.floor_s (LEGATO_HANG=floor_s=...), then run it again."
    )
