"""When the replay base is due by the clock: the time bound on a resume's replay and the cost bound on the bases' copies,
decided by every rank alike.

A new replay base (a Snapshot, legato.session.saving) is taken every
`replay_steps` steps and, here, also once the current one is older than
`replay_seconds`. Wall clocks and step times differ between ranks, so a rank
never acts on its own clock: its "overdue" flag travels in the stop
agreement's all-reduce (legato.dist.stop), and every rank takes the new base at
the same step, the one where the agreed flag comes back. Ranks whose bases were
taken at different steps would write a checkpoint whose replay starts from two
different states.

Each base is a memory copy of the rank's share of the state, O(state) on a step that saves nothing. So that the copies
cost at most `replay_cost` of the training time at any state size, each rank works out from its last copy and the steps
before it how many steps must pass before the next (`BaseClock.wanted`); the ranks take the largest (one all-reduce
after each base, legato.session.saving), and the steps rule skips a multiple of `replay_steps` that comes sooner. The
time bound is the user's bound on a resume's replay and is never delayed by the cost bound (only by the agreement's
cadence: about a second, or a fixed `agree_every_steps`, on one rank as on several). This module must never take a
snapshot or start a collective.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from legato.dist.stop import Decision

# The default bound: a tenth of the periodic checkpoint interval, so a resume replays at most about 10% of the work a
# hard kill would lose; 60 s (a tenth of the default 10 minutes) when checkpoints are not periodic by a fixed clock.
INTERVAL_FRACTION = 0.1
WITHOUT_INTERVAL_S = 60.0


def bound_seconds(replay_seconds: float | None, every_minutes: float | str) -> float:
    """The replay's time bound in seconds (0: none), from the policy's `replay_seconds` and `every_minutes` (`auto`: an
    interval that moves, so the bound of a run without one)."""
    if replay_seconds is not None:
        return replay_seconds
    if isinstance(every_minutes, str) or every_minutes <= 0:
        return WITHOUT_INTERVAL_S
    return INTERVAL_FRACTION * 60 * every_minutes


class BaseClock:
    """The age of this rank's replay base, and whether the ranks agreed that a new one is due."""

    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic, cost: float = 0.0) -> None:
        self.bound_s, self.cost, self.clock = bound_s, cost, clock
        self.taken_at = clock()
        self.spacing = 0  # the fewest steps from the current base to the next, agreed by the ranks (0: the steps rule alone)
        self._copied: tuple[int, float] | None = None  # the last base's step, and when its copy ended

    def taken(self) -> None:
        """A new base is being taken now."""
        self.taken_at = self.clock()

    def wanted(self, step: int, copy_s: float) -> int:
        """This rank's fewest steps from the base just taken at `step` (its copy took `copy_s`) to the next, for the copies
        to cost at most `cost` of the time trained between them: the copy's time over the cost, in steps as long as the
        steps since the previous base's copy ended. 0 before a second base, or with no cost bound."""
        previous, self._copied = self._copied, (step, self.clock())
        if previous is None or self.cost <= 0:
            return 0
        steps, trained_s = step - previous[0], self.taken_at - previous[1]
        if steps <= 0 or trained_s <= 0:
            return 0
        return math.ceil(copy_s * steps / (self.cost * trained_s))

    def overdue(self) -> bool:
        """This rank's own view, for the agreement only: its base is older than the bound."""
        return self.bound_s > 0 and self.clock() - self.taken_at >= self.bound_s

    @staticmethod
    def agreed(decision: Decision, base_step: int | None) -> bool:
        """Whether the ranks agreed on a new base now: some rank was overdue at the check whose flags `decision` holds,
        and no base was taken since (a base taken at or after that check made the flag stale). The same on every rank:
        the decision and the base's step are."""
        return decision.base_due and decision.checked_at is not None and (base_step is None or base_step < decision.checked_at)
