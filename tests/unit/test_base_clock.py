"""The replay's time and cost bounds: when a new replay base is due, and that every rank takes it at the same step.

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
from legato.session.replay_base import ReplayBase
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


# -- the cost bound: bases spaced so that their copies cost at most `replay_cost` of the time trained ----------------


def spaced_bases(copy_s: list[float], step_s: float, steps: int, agreed: bool, cost: float = 0.02) -> list[list[int]]:
    """The steps at which each rank takes a base, its copies taking `copy_s[rank]` seconds and its steps `step_s`; the
    spacing each rank wants is agreed as legato.session.saving does (the largest, a FAKE of its all-reduce), or, the
    planted fault, kept local."""
    clocks = [FakeClock() for _ in copy_s]
    base = [BaseClock(0.0, clock, cost=cost) for clock in clocks]
    taken: list[list[int]] = [[] for _ in copy_s]

    def take(step: int, ranks: list[int]) -> None:
        wanted = {}
        for rank in ranks:
            base[rank].taken()
            clocks[rank].advance(copy_s[rank])
            wanted[rank] = base[rank].wanted(step, copy_s[rank])
            taken[rank].append(step)
        for rank in ranks:
            base[rank].spacing = max(wanted.values()) if agreed else wanted[rank]

    take(0, list(range(len(copy_s))))
    for step in range(1, steps + 1):
        for clock in clocks:
            clock.advance(step_s)
        due = [rank for rank, b in enumerate(base) if step % REPLAY_STEPS == 0 and step - taken[rank][-1] >= b.spacing]
        assert not agreed or len(due) in (0, len(base)), (step, due)
        take(step, due)
    return taken


def test_wanted_is_the_copy_over_the_cost_in_steps_of_the_span_trained() -> None:
    clock = FakeClock()
    base = BaseClock(0.0, clock, cost=0.02)
    base.taken()
    clock.advance(0.001)
    assert base.wanted(0, 0.001) == 0  # the first base: no steps measured yet
    clock.advance(1.0)  # 32 steps of 1/32 s
    base.taken()
    clock.advance(0.1)
    assert base.wanted(32, 0.1) == 160  # 0.1 s is 2% of 5 s: 160 steps of 1/32 s
    clock.advance(5.0)
    base.taken()
    clock.advance(0.001)
    assert base.wanted(192, 0.001) == 2  # a small copy: 0.05 s of steps, two steps of 1/32 s
    free = BaseClock(0.0, clock, cost=0.0)
    free.taken()
    free.wanted(0, 1.0)
    clock.advance(1.0)
    free.taken()
    assert free.wanted(32, 1.0) == 0  # no cost bound: the steps rule alone


def test_a_small_copy_keeps_every_replay_steps_and_a_large_one_is_spaced_to_its_cost() -> None:
    small = spaced_bases([0.0001, 0.0001], 0.03, 400, agreed=True)
    assert small[0] == small[1] == list(range(0, 401, REPLAY_STEPS))
    large = spaced_bases([0.15, 0.15], 0.03, 2000, agreed=True)
    gaps = [b - a for a, b in zip(large[0], large[0][1:])]
    assert large[0] == large[1] and all(g % REPLAY_STEPS == 0 for g in gaps), large
    # 0.15 s copies at 2%: 7.5 s of 30 ms steps, 250 steps, on the next multiple of 32 (256), after the first gap
    assert gaps[0] == REPLAY_STEPS and set(gaps[1:]) == {256}, gaps


def test_planted_fault_spacing_kept_on_each_rank_takes_bases_at_different_steps() -> None:
    """Ranks whose copies took different times want different spacings: kept local they split (a checkpoint of theirs
    would replay from two states); agreed, the largest holds on both."""
    local = spaced_bases([0.1, 0.16], 0.03, 2000, agreed=False)
    assert local[0] != local[1]
    agreed = spaced_bases([0.1, 0.16], 0.03, 2000, agreed=True)
    assert agreed[0] == agreed[1]


def test_the_replay_base_skips_a_multiple_of_replay_steps_before_its_agreed_spacing() -> None:
    base = ReplayBase(CheckpointPolicy(replay_steps=4), rank=0)
    assert base.snapshot is not None
    base.snapshot.step = 8
    base.clock.spacing = 10
    assert [s for s in range(9, 40) if base.due(s, total_steps=100)] == [20, 24, 28, 32, 36]
    base.clock.spacing = 0
    assert [s for s in range(9, 40) if base.due(s, total_steps=100)] == [12, 16, 20, 24, 28, 32, 36]
    assert not base.due(100, total_steps=100)
