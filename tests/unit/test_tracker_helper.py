"""session.tracker(): each step's point written once across a resume's replay and a killed attempt's extra points.

The logic tests drive `Tracker` with a fake loop and a recording sink (fast, and they say so). The real test trains
a one-rank Session in this process with a real `SummaryWriter`, leaves the loop three steps past a checkpoint (as a
kill leaves points past it), resumes with a replay, and reads the event files back with TensorBoard's own
`EventAccumulator`; the same checker catches a second attempt that logs through a plain writer with no purge.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import fit_step, trajectory

import legato
from legato.errors import UsageError
from legato.session.trackers import Tracker, sinks_for

STEPS, CHECKPOINT_EVERY, LEFT_AT = 20, 5, 13


@dataclass
class FakeLoop:
    """A stand-in for the Session's loop (logic tests only)."""

    rank: int = 0
    stopped: bool = False
    replaying: bool = False
    step: int = 0
    resumed_step: int = 0
    run_id: str = "r1"
    begun: bool = True


@dataclass
class RecordingSink:
    """A dashboard that keeps what it was given (logic tests only)."""

    held_below: int = 0
    opened: list[tuple[int, str]] = field(default_factory=list)
    points: list[tuple[int, dict]] = field(default_factory=list)
    flushes: int = 0

    def open(self, resumed_step: int, run_id: str) -> None:
        self.opened.append((resumed_step, run_id))

    def holds(self, step: int) -> bool:
        return step < self.held_below

    def write(self, values: Mapping[str, float], step: int) -> None:
        self.points.append((step, dict(values)))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        return


def test_a_point_is_written_once_where_the_loop_trains_a_step_for_the_first_time() -> None:
    loop, sink = FakeLoop(step=7, resumed_step=7), RecordingSink()
    tracker = Tracker(loop, [sink])
    loop.replaying = True
    assert not tracker.log({"loss": 1.0}) and sink.opened == []  # a replayed step: nothing, not even opened
    loop.replaying = False
    assert tracker.log({"loss": torch.tensor(0.5)})
    assert tracker.log({"val": 2}, step=9)
    loop.stopped = True
    assert not tracker.log({"val": 3.0})  # after the agreed stop: the resumed run logs it
    assert sink.opened == [(7, "r1")] and sink.points == [(7, {"loss": 0.5}), (9, {"val": 2.0})]


def test_other_ranks_and_steps_a_dashboard_holds_are_skipped() -> None:
    quiet = RecordingSink()
    assert not Tracker(FakeLoop(rank=1), [quiet]).log({"loss": 1.0}) and quiet.points == []
    held = RecordingSink(held_below=12)
    loop = FakeLoop(step=10, resumed_step=10)
    tracker = Tracker(loop, [held])
    assert not tracker.log({"loss": 1.0})
    loop.step = 12
    assert tracker.log({"loss": 1.0}) and [s for s, _ in held.points] == [12]
    tracker.flush()
    assert held.flushes == 1


def test_logging_before_the_loop_and_options_the_tracker_owns_are_refused() -> None:
    with pytest.raises(UsageError, match="before the Session's loop began"):
        Tracker(FakeLoop(begun=False), [RecordingSink()]).log({"loss": 1.0})
    with pytest.raises(UsageError, match="purge_step"):
        sinks_for("tb", {"purge_step": 3}, None)
    with pytest.raises(UsageError, match="remove id, resume from"):
        sinks_for(None, {}, {"id": "x", "resume": "must", "project": "p"})
    with pytest.raises(UsageError, match="names no dashboard"):
        sinks_for(None, {}, None)


def _attempt(run_dir: Path, log_dir: Path, leave_at: int | None = None, plain_writer: bool = False) -> legato.Session:
    """One launch: trains to the end, or leaves the loop after step `leave_at` as a killed launch would stop logging;
    `plain_writer` plants a fault (a SummaryWriter with no purge that logs every step, replayed ones too)."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    policy = legato.CheckpointPolicy(every_steps=CHECKPOINT_EVERY, replay_steps=4, replay_cost=0, every_minutes=0)
    session = legato.Session(run_dir, model=model, optimizer=optimizer, total_steps=STEPS, checkpoint=policy)
    tracker = session.tracker(tensorboard=log_dir)
    writer = SummaryWriter(log_dir) if plain_writer else None
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)) for _ in range(STEPS)]
    for step in session:
        loss = fit_step(model, optimizer, *batches[step])
        session.report(loss)
        if writer is not None:
            writer.add_scalar("train/loss", loss.item(), step)
        else:
            tracker.log({"train/loss": loss})
        if step == leave_at:
            break
    tracker.close()
    if writer is not None:
        writer.close()
    return session


def tracker_problems(run_dir: Path, log_dir: Path) -> list[str]:
    """What TensorBoard shows wrong: a step twice or never, or a point that is not the step's loss in the trajectory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    points = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    problems = []
    twice = sorted(step for step, n in Counter(step for step, _ in points).items() if n > 1)
    if twice:
        problems.append(f"steps logged twice: {twice}")
    if sorted({step for step, _ in points}) != list(range(STEPS)):
        problems.append("steps missing")
    losses = {r["step"] - 1: float.fromhex(r["loss_hex"]) for r in trajectory(run_dir, 0)}
    # TensorBoard keeps float32: the point is the loss rounded once, bit for bit.
    wrong = [step for step, value in points if value != torch.tensor(losses[step], dtype=torch.float32).item()]
    if wrong:
        problems.append(f"not the step's loss at {wrong}")
    return problems


def test_a_resume_after_points_past_the_checkpoint_leaves_one_point_per_step(tmp_path: Path) -> None:
    run_dir, log_dir = tmp_path / "run", tmp_path / "tb"
    _attempt(run_dir, log_dir, leave_at=LEFT_AT)
    second = _attempt(run_dir, log_dir)
    assert second.resumed is not None and second.resumed_step == 10 and second.step == STEPS
    assert tracker_problems(run_dir, log_dir) == []


def test_the_checker_catches_a_second_attempt_logging_without_the_tracker(tmp_path: Path) -> None:
    run_dir, log_dir = tmp_path / "run", tmp_path / "tb"
    _attempt(run_dir, log_dir, leave_at=LEFT_AT)
    _attempt(run_dir, log_dir, plain_writer=True)
    assert any(p.startswith("steps logged twice") for p in tracker_problems(run_dir, log_dir))
