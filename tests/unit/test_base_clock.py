"""The replay's time bound: when a new replay base is due by the clock, and that every rank takes it at the same step.

Fast unit tests of the decision logic (legato.session.base_clock) with a FAKE clock (`FakeClock`: time advances only
when a test says so) and, for two ranks, a FAKE agreement (`FakeAgreement`: the MAX over both ranks' flags, read one
check later, as legato.dist.stop's non-blocking all-reduce is). The real all-reduce, real ranks and a real resume are in
tests/e2e/test_replay_time.py. The planted fault: ranks that decide on their own clocks (what StopAgreement without a
process group hands back) take their bases at different steps, and a checkpoint of theirs is refused a replay, named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.dist.stop import Decision, StopAgreement
from legato.session.base_clock import BaseClock, bound_seconds
from legato.session.policy import CheckpointPolicy
from legato.store import bases

REPLAY_STEPS = 32
BOUND_S = 1.0


class FakeClock:
    """A fake monotonic clock: it moves only by `advance`."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeAgreement:
    """A fake of the stop agreement's all-reduce for two ranks in one process: each check hands back the MAX of the
    flags sent at the check before (the non-blocking all-reduce's latency), every step a check."""

    def __init__(self) -> None:
        self.pending: tuple[int, bool] | None = None

    def boundary(self, step: int, base_due: list[bool]) -> Decision:
        previous, self.pending = self.pending, (step, any(base_due))
        if previous is None:
            return Decision(stop=False, checkpoint_due=False)
        return Decision(stop=False, checkpoint_due=False, checked_at=previous[0], base_due=previous[1])


def base_steps(step_s: list[float], steps: int, agreed: bool) -> list[list[int]]:
    """The steps at which each rank takes a new base, its steps taking `step_s[rank]` seconds (clocks and jitter differ
    between ranks); `agreed`: through the agreement, else each rank on its own flag (the fault)."""
    clocks = [FakeClock() for _ in step_s]
    base = [BaseClock(BOUND_S, clock) for clock in clocks]
    agreement, taken = FakeAgreement(), [[0] for _ in step_s]
    for step in range(1, steps + 1):
        for clock, seconds in zip(clocks, step_s):
            clock.advance(seconds)
        flags = [b.overdue() for b in base]
        if agreed:
            decisions = [agreement.boundary(step, flags)] * len(base)
        else:
            decisions = [StopAgreement(None).boundary(step, False, False, base_due_local=flag) for flag in flags]
        for rank, decision in enumerate(decisions):
            if step % REPLAY_STEPS == 0 or BaseClock.agreed(decision, taken[rank][-1]):
                taken[rank].append(step)
                base[rank].taken()
    return taken


def test_the_default_bound_is_a_tenth_of_the_periodic_interval_or_60_s() -> None:
    assert CheckpointPolicy().replay_seconds is None
    assert bound_seconds(None, CheckpointPolicy().every_minutes) == 60.0
    assert bound_seconds(None, 2.0) == 12.0
    assert bound_seconds(None, 0.0) == 60.0
    assert bound_seconds(0.0, 10.0) == 0.0 and bound_seconds(5.0, 10.0) == 5.0


def test_a_base_is_overdue_once_older_than_the_bound_and_never_with_no_bound() -> None:
    clock = FakeClock()
    base, unbounded = BaseClock(BOUND_S, clock), BaseClock(0.0, clock)
    clock.advance(0.999)
    assert not base.overdue()
    clock.advance(0.001)
    assert base.overdue() and not unbounded.overdue()
    base.taken()
    assert not base.overdue()
    clock.advance(10**6)
    assert not unbounded.overdue()


@pytest.mark.parametrize(
    ("decision", "base_step", "due"),
    [
        (Decision(False, False, checked_at=10, base_due=True), 8, True),
        (Decision(False, False, checked_at=10, base_due=True), 10, False),  # taken at that check, after the flags: stale
        (Decision(False, False, checked_at=10, base_due=True), 11, False),
        (Decision(False, False, checked_at=10, base_due=False), 8, False),
        (Decision(False, False), 8, False),  # no agreement read at this step
        (Decision(False, False, checked_at=3, base_due=True), None, True),
    ],
)
def test_the_agreed_flag_is_honoured_once_and_never_when_stale(decision: Decision, base_step: int | None, due: bool) -> None:
    assert BaseClock.agreed(decision, base_step) is due


def test_slow_steps_take_bases_by_the_clock_before_replay_steps_at_the_same_steps_on_every_rank() -> None:
    """0.2 s and 0.3 s steps against a 1 s bound: a base every few steps, far fewer than 32, the same on both ranks;
    the replay is then at most the bound plus the agreement's latency (two steps)."""
    taken = base_steps([0.2, 0.3], 100, agreed=True)
    assert taken[0] == taken[1]
    gaps = [b - a for a, b in zip(taken[0], taken[0][1:])]
    assert any(step % REPLAY_STEPS for step in taken[0][1:]), taken
    assert max(gaps) <= BOUND_S / 0.2 + 2 and max(gaps) < REPLAY_STEPS, taken


def test_fast_steps_keep_the_steps_bound() -> None:
    taken = base_steps([0.001, 0.001], 100, agreed=True)
    assert taken == [[0, 32, 64, 96]] * 2


def test_planted_fault_bases_decided_on_each_ranks_own_clock_split_and_the_checkpoint_is_refused_a_replay(tmp_path: Path) -> None:
    """Without the agreement the ranks' bases fall on different steps; a checkpoint of such ranks names the fault and
    resumes without a replay (verified by its digests) instead of replaying from two states."""
    local = base_steps([0.2, 0.3], 100, agreed=False)
    assert local[0] != local[1]
    agreed = base_steps([0.2, 0.3], 100, agreed=True)

    def manifest(steps: list[list[int]]) -> dict:
        ranks = [{"rank": rank, "from_step": taken[-1], "hash": "h", "components": {}, "steps": []} for rank, taken in enumerate(steps)]
        return {"step": 100, "replay": {"from_step": ranks[0]["from_step"], "ranks": ranks}}

    problem = bases.problem(tmp_path / "step_100", manifest(local))
    assert problem is not None and "replay bases are of different steps" in problem
    assert f"rank 0: step {local[0][-1]}, rank 1: step {local[1][-1]}" in problem
    assert bases.problem(tmp_path / "step_100", manifest(agreed)) is None


def test_the_config_key_is_checked_and_unset_by_default() -> None:
    from legato.config import config_from_dict
    from legato.errors import UsageError

    assert config_from_dict({}).checkpoint.replay_seconds is None
    assert config_from_dict({"checkpoint": {"replay_seconds": 30}}).checkpoint.replay_seconds == 30.0
    with pytest.raises(UsageError, match="checkpoint.replay_seconds is -1.0, but it must be at least 0"):
        config_from_dict({"checkpoint": {"replay_seconds": -1}})
