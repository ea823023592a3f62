"""How the CLI shows a run to people: event lines, the live progress line, the attempts table.

Part of the CLI (the only layer that formats for people); everything else
hands it plain dicts and dataclasses. On a terminal the progress line is
redrawn in place; elsewhere (logs, CI) it is printed at most every few seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from legato.events import Kind, except_label, hang_label, interval_label, loop_left_label, resharded_label, unverified_label
from legato.orchestrator.goodput import BUCKETS, Spent
from legato.orchestrator.status import RunSummary
from legato.slurm.pending import describe
from legato.voice import counted

PLAIN_PROGRESS_EVERY_S = 5.0


def short(h: str | None) -> str:
    """The first 12 characters of a hash, or "-" when there is none."""
    return (h or "-")[:12]


def _size(n: int | None) -> str:
    """Bytes for people: KiB below a MiB (a checkpoint held by its replay writes a few step records)."""
    n = n or 0
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class LiveView:
    """Turns supervisor notifications into lines on a stream."""

    def __init__(self, stream: TextIO = sys.stdout, events: tuple[str, ...] | None = None) -> None:
        self.stream = stream
        self.events = events
        self.tty = stream.isatty()
        self.attempts: dict[tuple[str, int | None], int] = {}  # keyed by a record's job tag, which may be absent
        self._progress_shown = False
        self._last_plain = 0.0
        self._step_seen = 0
        self._run = ""  # which of several runs the progress is of (a verification's reference, interrupted run...)
        self._runs_after = 0  # runs of as many steps still to come after this one: the ETA covers them too

    def begin_run(self, label: str, runs_after: int) -> None:
        """A new run of several starts (its steps count from 0 again): name it on the live line, and have the ETA also
        cover `runs_after` more runs of as many steps."""
        self.attempts.clear()
        self._step_seen, self._run, self._runs_after = 0, label, runs_after

    def __call__(self, kind: str, data: dict) -> None:
        if kind == Kind.PROGRESS:
            self._progress(data)
            return
        if kind == Kind.WAITING:
            self._live(waiting_line(data))
            return
        self._step_seen = max(self._step_seen, int(data.get("step") or data.get("last_step") or 0))
        line = self.event_line(data)
        if line is not None and (self.events is None or data["event"] in self.events):
            self._line(line)

    def learn(self, events: list[dict]) -> None:
        """Take in past events silently (attempt numbers), when attaching to a run in progress."""
        for e in events:
            if e["event"] == Kind.ATTEMPT_STARTED:
                self.attempts[(str(e["job_id"]), e["restart"])] = len(self.attempts) + 1

    def attempt_of(self, data: dict) -> int | None:
        return self.attempts.get((str(data.get("job_id")), data.get("restart")))

    def event_line(self, e: dict) -> str | None:
        kind = e["event"]
        if kind == Kind.ATTEMPT_STARTED:
            self.attempts[(str(e["job_id"]), e["restart"])] = len(self.attempts) + 1
        n = self.attempt_of(e)
        tag = f"attempt {n}: " if n else ""
        lines = {
            Kind.RUN_STARTED: lambda: f"run started: {e['executor']} executor, {e['world_size']} ranks, {e['total_steps']} steps",
            Kind.SUBMITTED: lambda: f"submitted job {e['job_id']}",
            Kind.JOB_STATE: lambda: f"job {e['job_id']} is {e['state']}",
            Kind.PENDING_REASON: lambda: f"job {e['job_id']} waits: {describe(e['reason'])}",
            Kind.ATTEMPT_STARTED: lambda: (
                f"{tag}started (job {e['job_id']}, restart {e['restart']}, {e['world_size']} ranks on {', '.join(e['hosts'])})"
            ),
            Kind.PREEMPT_SENT: lambda: f"{tag}chaos: sent SIG{e['signal']} to every task",
            Kind.STOP_SIGNAL: lambda: (
                f"{tag}stop signal reached rank {e['rank']} during start-up; the ranks stopped at step {e['step']} without a new checkpoint"
                if e.get("at_start")
                else f"{tag}stop signal reached rank {e['rank']}; the ranks agreed to stop after step {e['step']}"
            ),
            Kind.CHECKPOINT_COMMITTED: lambda: (
                f"{tag}{e['reason']} checkpoint at step {e['step']} committed in {e['seconds']:.2f}s "
                f"({_committed_size(e)}), global hash {short(e['global_hash'])}" + _diverged_words(e.get("diverged"))
            ),
            Kind.RESUMED: lambda: (
                (
                    (f"{tag}resumed at step {e['step']}: {resharded_label(e['resharded'])}" + _resume_time(e))
                    if e.get("resharded")
                    else (
                        f"{tag}resumed at step {e['step']}: {_replay_words(e.get('replay'))}state hash {short(e['recomputed_hash'])} "
                        + (
                            f"verified ✓{except_label(e.get('unregistered'))}"
                            if e["match"]
                            else f"does NOT match ✗ (checkpoint {short(e['expected_hash'])}; {_resume_problem(e)})"
                        )
                        + _resume_time(e)
                    )
                )
                + _fell_back(e.get("skipped"))
            ),
            Kind.CONTINUED_UNVERIFIED: lambda: f"{tag}{unverified_label(e)}: from here on not proven bitwise with the run's start",
            Kind.CHECKPOINT_FAILED: lambda: f"{tag}{e['message']}",
            Kind.REPLAY_STOPPED: lambda: (
                f"{tag}stopped during the replay after step {e['step']}; the checkpoint at step {e['checkpoint_step']} still stands"
            ),
            Kind.REQUEUED: lambda: f"{tag}requeued after step {e['last_step']} ({e['budget_left']} requeues left)",
            Kind.ATTEMPT_STOPPED: lambda: f"{tag}stopped at the committed checkpoint of step {e['step']}; the next launch resumes it",
            Kind.LOOP_LEFT: lambda: f"{tag}{loop_left_label(e)}",
            Kind.REQUEUE_FAILED: lambda: f"{tag}could not requeue: {e['reason']}",
            Kind.WORK_LOST: lambda: (
                f"{tag}the previous attempt trained to step {e['trained_to']}: the {e['lost_steps']} steps after the checkpoint "
                f"at step {e['step']} were lost and are trained again"
            ),
            Kind.CHECKPOINT_INTERVAL: lambda: f"{tag}{interval_label(e)}",
            Kind.HANG: lambda: f"{tag}{hang_label(e)}" + ("; the same hang as an earlier attempt's: not retried" if e["repeated"] else ""),
            Kind.RANK_LOST: lambda: (
                f"{tag}{e['reason']} after step {e['last_step']}; resubmitting from the checkpoint at step {e['checkpoint_step']}"
            ),
            Kind.LEFTOVER_CANCEL: lambda: f"job {e['job_id']} still ran after the run failed; cancelled it",
            Kind.LOST_RANK_CANCEL: lambda: f"job {e['job_id']} still ran {e['grace_s']:.0f}s after it lost a rank; cancelled it",
            Kind.RESUBMITTED: lambda: (
                f"job {e['previous_job_id']} ended ({e['reason']}) without requeuing itself; resubmitted as job {e['job_id']}"
                + "".join(f"; node {n} is {s}" for n, s in e.get("failed_nodes", {}).items())
                + "".join(f"; leaving out node {n}: {why}" for n, why in e.get("suspect_nodes", {}).items())
                + (f"; excluding {', '.join(e['excluded'])}" if e.get("excluded") else "")
            ),
            Kind.FINISHED: lambda: f"{tag}training complete at step {e['step']}, final global hash {e['final_global_hash']}",
            Kind.FAILED: lambda: f"{tag}FAILED: {e['reason']}",
            Kind.CANCEL_REQUESTED: lambda: "cancel requested",
            Kind.REPRO_CAPTURED: lambda: (
                f"{tag}environment captured in {e['seconds']:.2f}s ({e['path']})"
                + (f"; failed: {', '.join(e['failures'])}" if e["failures"] else "")
            ),
            Kind.REPRO_FAILED: lambda: f"{tag}environment capture failed: {e['reason']}",
            Kind.CANCELLED: lambda: f"cancelled: {e.get('reason')}",
        }
        render = lines.get(kind)
        return render() if render else None

    def _progress(self, p: dict) -> None:
        if p["step"] < self._step_seen:
            return  # an older reading than what the events already told
        n = self.attempt_of(p)
        rate = p.get("steps_per_s")
        if not rate and not self.tty:
            return  # an attempt's first reading has no rate yet: a printed line says something or nothing
        left = (p["total_steps"] * (1 + self._runs_after) - p["step"]) / rate if rate else None
        loss = "-" if p.get("loss") is None else f"{p['loss']:.4f}"
        rate_text = f"{rate:.1f}" if rate else "-"
        where = (f"{self._run} | " if self._run else "") + (f"attempt {n} | " if n else "")
        whole = " (all runs)" if self._runs_after else ""
        self._live(f"{where}step {p['step']}/{p['total_steps']} | loss {loss} | {rate_text} steps/s | ETA {_duration(left)}{whole}")

    def _live(self, text: str) -> None:
        """The live line: redrawn in place on a terminal, elsewhere printed at most every few seconds."""
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self._progress_shown = True
            return
        if time.monotonic() - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
            self._last_plain = time.monotonic()
            self._line(text)

    def _line(self, text: str) -> None:
        if self._progress_shown:
            self.stream.write("\r\033[K")
            self._progress_shown = False
        self.stream.write(f"legato: {text}\n")
        self.stream.flush()


def _replay_words(replay: dict | None) -> str:
    if not replay:
        return ""
    if replay["identical"]:
        took = f" in {replay['seconds']:.2f}s" if isinstance(replay.get("seconds"), (int, float)) else ""
        return f"replay ✓ {counted(replay['steps'], 'step')} from step {replay['from_step']}{took}, "
    return f"replay ✗ diverged at step {replay['first_divergence']['step']}, "


def _fell_back(skipped: list[str] | None) -> str:
    """The newer checkpoints a resume passed over because they did not verify (older ledgers do not say)."""
    return "" if not skipped else f"; FELL BACK past {len(skipped)} checkpoint(s) that did not verify: {'; '.join(skipped)}"


def _resume_time(e: dict) -> str:
    """The resume's total time (choosing, verifying and loading the checkpoint, and the replay); older ledgers lack it."""
    seconds = e.get("seconds")
    return "" if seconds is None else f"; resume took {seconds:.2f}s"


def _committed_size(e: dict) -> str:
    """A checkpoint's size; one that holds its state as the replay of the steps since an earlier one says so, as it
    writes the steps' records alone (often no file at all), which would otherwise read as an empty checkpoint."""
    base = e.get("replays_from")
    if base is None:
        return _size(e["bytes"])
    return f"the state of step {base} and {counted(e['step'] - base, 'step')} to replay from it; {_size(e['bytes'])} written"


def _diverged_words(diverged: dict[str, list[str]] | None) -> str:
    """A checkpoint whose ranks held replicated state unlike the copy written for every rank: no resume from it verifies."""
    if not diverged:
        return ""
    ranks = ", ".join(sorted(diverged, key=int))
    return (
        f"; WARNING: rank(s) {ranks} held replicated state that differs from the copy saved for every rank, so a resume "
        "from it will fail its verification (see the rank's log)"
    )


def _resume_problem(e: dict) -> str:
    replay = e.get("replay")
    if replay and not replay["identical"]:
        d = replay["first_divergence"]
        return f"replay diverged first at step {d['step']} on rank {d['rank']}: {d['cause']}"
    return str(e["mismatches"])


def waiting_line(w: dict) -> str:
    """A pending job in words: how long it has waited and the scheduler's reason (a `WAITING` report)."""
    why = f": {describe(w['reason'])}" if w.get("reason") else ""
    return f"job {w['job_id']} pending for {_duration(w['waited_s'])}{why}"


def goodput_line(spent: Spent) -> str:
    """The run's time in words: "goodput 81% of 1h02m: training 50m, queued 3m, ..." (buckets that took any time)."""
    parts = ", ".join(f"{name} {_span(getattr(spent, name))}" for name in BUCKETS if getattr(spent, name) >= 0.05)
    margin = "" if spent.margin_s is None else f"; the closest stop committed {_span(spent.margin_s)} before its time limit"
    return f"goodput {100 * (spent.goodput or 0):.0f}% of {_span(spent.wall)}: {parts}{margin}"


def _span(seconds: float) -> str:
    """A bucket's time: tenths of a second under a minute, else as `_duration` says it."""
    return f"{seconds:.1f}s" if 0 <= seconds < 60 else _duration(seconds)


def status_table(summary: RunSummary) -> str:
    """The run summary as the text table `legato status` prints: one row per attempt, then the run's state."""
    header = ("#", "job", "restart", "host", "steps", "resumed at", "verified", "replay", "resume s", "ckpt s", "environment", "ended")
    rows = [header]
    for a in summary.attempts:
        verified = "-" if a.verified is None else ("✓" if a.verified else "✗, went on" if a.continued_unverified else "✗")
        if a.verified and a.unregistered:
            verified = f"✓ except {len(a.unregistered)}"
        if a.resharded:
            verified = f"resharded {a.resharded['from']}->{a.resharded['to']}"
        ckpt = f"{max(a.checkpoint_seconds):.2f}" if a.checkpoint_seconds else "-"
        resumed = "-" if a.resumed_from_step is None else str(a.resumed_from_step) + (" (fell back)" if a.skipped else "")
        env = "-" if a.environment_changed is None else ("CHANGED: " + ",".join(a.environment_changed) if a.environment_changed else "same")
        resume = "-" if a.resume_seconds is None else f"{a.resume_seconds:.2f}"
        rows.append(
            (
                str(a.number),
                a.job_id,
                str(a.restart),
                ",".join(a.hosts),
                str(a.steps_run),
                resumed,
                verified,
                a.replay_text,
                resume,
                ckpt,
                env,
                a.ended + (f"; {a.lost_steps} steps lost" if a.lost_steps else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    state = summary.state.upper()
    total = summary.total_steps or "?"
    head = (
        f"run {summary.run_dir}: {state}, step {summary.step}/{total}, {len(summary.attempts)} attempt(s), "
        f"{summary.requeues} requeue(s), {summary.resubmissions} resubmission(s)"
    )
    tail = [goodput_line(summary.spent)] if summary.spent.wall > 0 else []
    if summary.excluded_nodes:
        tail.append(f"nodes excluded after they failed: {', '.join(summary.excluded_nodes)}")
    if summary.finished:
        resharded = sum(1 for a in summary.attempts if a.resharded)
        tail.append(
            f"final global hash {summary.final_global_hash}; every resume verified: "
            f"{'yes' if summary.all_resumes_verified else 'NO'}"
            + (f" ({resharded} resharded: chunks checked, not bitwise)" if resharded else "")
        )
    tail += [f"attempt {a.number}: {resharded_label(a.resharded)}" for a in summary.attempts if a.resharded]
    tail += [f"attempt {a.number} fell back past {'; '.join(a.skipped)}" for a in summary.attempts if a.skipped]
    tail += [f"attempt {a.number}: {s.label}" for a in summary.attempts for s in a.stragglers]
    if summary.lost_steps:
        tail.append(f"lost work: {summary.lost_steps} steps trained past a checkpoint by attempts that ended without one, trained again")
    if summary.unregistered:
        any_resumed = any(a.resumed_from_step is not None for a in summary.attempts)
        tail.append(
            f"resumes verified{except_label(summary.unregistered)} (legato does not save them: register or ignore each)"
            if any_resumed
            else f"the census found state legato does not save: {', '.join(summary.unregistered)} (register each "
            "one training changes, or ignore it)"
        )
    if summary.unverified:
        tail.append(f"NOT bitwise from its start: {unverified_label(summary.unverified)}; resumes since are verified from there")
    if summary.failure:
        tail.append(f"reason: {summary.failure}")
    return "\n".join([head, "", *lines, *([""] + tail if tail else [])])
