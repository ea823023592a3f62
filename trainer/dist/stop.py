"""Agreed stop: a signal only sets a flag; the ranks agree on the step to stop after.

At agreed step boundaries each rank starts a non-blocking MAX all-reduce of
its local flags and reads the one it started at the previous check, so the
collective's latency hides behind the steps in between and every rank reaches
the same decision after the same step, whichever rank got the signal and
when. Checks are spaced so that their cost stays a small fraction of a step
(on a busy CPU even an idle all-reduce costs about a millisecond).
The same all-reduce carries the "periodic checkpoint is due by the clock" and
"new replay base is due by the clock" flags, because wall clocks differ between
ranks, and whether any rank is still writing (or failed to write) an
asynchronous checkpoint. A rank without peers keeps the same cadence (its
votes are read at its checks: most boundaries read nothing) but acts on its
own stop signal at once: it has no one to agree with. The signal handler must
never do anything but set the flag: no I/O, no collectives, no checkpointing.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from legato.system.signals import parse_signal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """What every rank agreed on at one step boundary."""

    stop: bool
    checkpoint_due: bool
    writing: bool = False  # some rank's asynchronous checkpoint files are not durable yet
    failed: bool = False  # some rank's asynchronous checkpoint write failed
    checked_at: int | None = None  # the step whose flags these are (None: no agreement was read)
    base_due: bool = False  # some rank's replay base is older than its time bound (legato.session.base_clock)


# What a boundary without an agreement read hands back (most steps': one object, not one a step).
NOTHING_AGREED = Decision(stop=False, checkpoint_due=False)


class StopFlag:
    """Installs the stop-signal handler and remembers when the signal first came."""

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self.signals = signals
        self.received_at: float | None = None
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Callable | int | None] = {}

    def install(self) -> None:
        """Take over the signals; a signal an earlier StopFlag already caught counts as received here.

        Then unblock them: a launcher may start a process with its stop signals blocked
        (`legato.slurm.startmask`), and a signal held since start-up is delivered to this handler now.
        """
        for sig in self.signals:
            previous = signal.signal(sig, self._handle)
            self._previous[sig] = previous
            earlier = getattr(previous, "__self__", None)
            if isinstance(earlier, StopFlag) and earlier.raised and not self.raised:
                self.received_at, self.signum = earlier.received_at, earlier.signum
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @property
    def raised(self) -> bool:
        return self.received_at is not None

    def _handle(self, signum: int, frame: object) -> None:
        if self.received_at is None:
            self.received_at = time.time()
            self.signum = signum


class StopAgreement:
    """A non-blocking all-reduce every `interval` steps; each decision is read at the next check.

    The interval is fixed (`every_steps` > 0) or agreed: every rank proposes
    how many of its steps fill about `target_s` seconds, and the smallest
    proposal wins through the same all-reduce, so every rank checks at the same
    steps. An interval at most doubles from one check to the next. A stop signal is acted on within two intervals.
    Without a group the votes are this rank's own, decided at once at its checks and at the first boundary after
    a stop signal.
    """

    MAX_INTERVAL = 10_000

    def __init__(self, group: dist.ProcessGroup | None, every_steps: int = 0, target_s: float = 1.0) -> None:
        self.group = group
        self.fixed = every_steps
        self.target_s = target_s
        self.interval = every_steps or 1
        self._next_check: int | None = None
        self._last_check = (0, time.monotonic())
        self._pending: tuple[dist.Work, torch.Tensor, int] | None = None
        self._closed = False

    def boundary(self, step: int, stop_local: bool, checkpoint_due_local: bool = False, writing_local: bool = False, failed_local: bool = False,
                 base_due_local: bool = False) -> Decision:
        """Called after a step, at least wherever `checks_at` holds; returns what the ranks agreed at the previous check
        (without a group: at this one)."""
        if self._closed:
            raise RuntimeError("StopAgreement.boundary() after close(): the Session's loop has ended")
        if self._next_check is None:
            self._next_check = step
            self._last_check = (step, time.monotonic())
        if not self.checks_at(step, stop_local):
            return NOTHING_AGREED
        if self.group is None:
            self.interval = self._propose(step)
            self._next_check = step + self.interval
            return Decision(stop_local, checkpoint_due_local, writing_local, failed_local, step, base_due_local)
        decision, agreed_interval = self._collect()
        flags = torch.tensor(
            [int(stop_local), int(checkpoint_due_local), -self._propose(step), int(writing_local), int(failed_local), int(base_due_local)],
            dtype=torch.int64,
        )
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, flags, step)
        if agreed_interval:
            self.interval = agreed_interval
        self._next_check = step + self.interval
        return decision

    def checks_at(self, step: int, stop_local: bool) -> bool:
        """Whether `boundary(step)` reads the votes (the caller gathers them only then): at the first boundary, at the
        agreed checks, and without a group at once after a stop signal."""
        return self._next_check is None or step >= self._next_check or (stop_local and self.group is None)

    def next_check(self, step: int) -> int:
        """The first step after `step` whose boundary reads the votes (a stop signal on a rank without peers aside)."""
        return step + 1 if self._next_check is None else max(step + 1, self._next_check)

    def drain(self) -> None:
        """Finish the outstanding all-reduce (before a collective-free exit or teardown)."""
        self._collect()

    def close(self) -> None:
        """Finish the outstanding all-reduce and let the group go (the Session ends it); no boundary after this."""
        self.drain()
        self.group = None
        self._closed = True

    def _propose(self, step: int) -> int:
        if self.fixed:
            return self.fixed
        last_step, last_time = self._last_check
        now = time.monotonic()
        self._last_check = (step, now)
        if step == last_step:
            return 1
        per_step = (now - last_time) / (step - last_step)
        # At most twice the current interval: a burst of fast steps (a warm cache, a replay) must not set an interval
        # that slower steps after it would take minutes to reach, with a stop signal waiting.
        return max(1, min(self.MAX_INTERVAL, 2 * self.interval, int(self.target_s / max(per_step, 1e-9))))

    def _collect(self) -> tuple[Decision, int]:
        if self._pending is None:
            return NOTHING_AGREED, 0
        work, flags, step = self._pending
        self._pending = None
        work.wait()
        return Decision(bool(flags[0]), bool(flags[1]), bool(flags[3]), bool(flags[4]), step, bool(flags[5])), int(-flags[2])


def agree_at_start(flag: StopFlag, group: dist.ProcessGroup | None) -> bool:
    """Before the first step: whether any rank got a stop signal during start-up (one blocking all-reduce)."""
    if group is None:
        return flag.raised
    raised = torch.tensor([int(flag.raised)], dtype=torch.int64)
    dist.all_reduce(raised, op=dist.ReduceOp.MAX, group=group)
    return bool(raised[0])


def stop_signals(name: str, also_sigterm: bool) -> tuple[str, ...]:
    """The signals that request a stop: the configured one, plus SIGTERM when asked."""
    return (name, "TERM") if also_sigterm and parse_signal(name) != signal.SIGTERM else (name,)
