"""Fault injection for tests and demos: planted stops, skipped restores, kill-points, RNG drawn too early.

Everything is off by default. Stops can also be planted from outside an
unmodified script through the environment. This module must never be on the
path of a run that did not ask for it: each switch is inert unless set.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from legato.errors import UsageError
from legato.state.components import Component
from legato.store.commit import KillPoint

log = logging.getLogger(__name__)

CHAOS_AT_ENV = "LEGATO_CHAOS_SIGNAL_AT"
CHAOS_RANK_ENV = "LEGATO_CHAOS_SIGNAL_RANK"
CHAOS_SLEEP_ENV = "LEGATO_CHAOS_STEP_SLEEP_S"


@runtime_checkable
class _Drawing(Protocol):
    def draw(self) -> None: ...


@dataclass(frozen=True)
class Chaos:
    """Fault injection for tests and demos; all off by default."""

    signal_rank: int = 0
    signal_at_steps: tuple[int, ...] = ()
    skip_restore: frozenset[str] = frozenset()
    kill: KillPoint | None = None
    consume_rng_after_restore: tuple[str, ...] = ()
    step_sleep_s: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Chaos:
        """Faults planted from outside an unmodified script: LEGATO_CHAOS_SIGNAL_AT="13,26", LEGATO_CHAOS_SIGNAL_RANK="1",
        and LEGATO_CHAOS_STEP_SLEEP_S="0.2" (slower steps, so a test can signal a run from outside mid-way)."""
        at, rank = environ.get(CHAOS_AT_ENV, "").strip(), environ.get(CHAOS_RANK_ENV, "0").strip()
        sleep = environ.get(CHAOS_SLEEP_ENV, "0").strip() or "0"
        try:
            steps = tuple(int(s) for s in at.split(",") if s.strip())
            signal_rank = int(rank)
            step_sleep_s = float(sleep)
        except ValueError:
            step_sleep_s = -1.0
        if not 0 <= step_sleep_s < float("inf"):
            raise UsageError(
                f"{CHAOS_AT_ENV}={at[:40]!r} / {CHAOS_RANK_ENV}={rank[:40]!r} / {CHAOS_SLEEP_ENV}={sleep[:40]!r}: expected comma-separated "
                f"step numbers, one rank number and seconds >= 0, such as {CHAOS_AT_ENV}=13,26 {CHAOS_RANK_ENV}=1 {CHAOS_SLEEP_ENV}=0.2. "
                "Fix or unset them."
            )
        return cls(signal_rank=signal_rank, signal_at_steps=steps, step_sleep_s=step_sleep_s)

    def agree_every(self, steps: int, from_env: bool) -> int:
        """The stop agreement's spacing, given the policy's `steps` (0: auto): stops planted from the environment land
        right after their step, so the ranks agree at every step then."""
        return 1 if from_env and self.signal_at_steps and not steps else steps

    def skips(self, component: str) -> bool:
        """Whether to leave `component` unrestored; short names (numpy, loader, cuda) name RNG components."""
        short = component.removeprefix("rng.").removeprefix("gen.")
        return component in self.skip_restore or short in self.skip_restore or (short.startswith("cuda") and "cuda" in self.skip_restore)

    def consumes(self, component: str) -> bool:
        """Whether to draw from RNG `component` right after the restore (python, numpy, torch)."""
        return component.startswith("rng.") and component.removeprefix("rng.") in self.consume_rng_after_restore

    def consume_rng(self, components: Iterable[Component]) -> None:
        """The classic bug of drawing random numbers between the restore and the first step."""
        for c in components:
            if self.consumes(c.name):
                assert isinstance(c.obj, _Drawing)  # the "rng." rows are legato.state.rng's generators, which all draw
                c.obj.draw()

    @property
    def per_step(self) -> bool:
        """Whether it acts at step boundaries (a slowed step, a planted stop signal)."""
        return bool(self.step_sleep_s or self.signal_at_steps)

    def slow_step(self) -> None:
        """Slow every step down, replayed ones too: a replay that ran faster than the steps after it would teach the
        stop agreement an interval the slowed steps then take minutes to reach."""
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)

    def after_step(self, rank: int, step: int, signum: signal.Signals) -> None:
        """Send this rank its stop signal after a planted step."""
        if rank == self.signal_rank and step in self.signal_at_steps:
            log.warning("chaos: rank %d sends itself %s after step %d", rank, signum.name, step)
            os.kill(os.getpid(), signum)
