"""A reported loss stays on its device until a number is needed (legato.session.losses): read back together, exactly,
in the order reported, and never once per step. A CPU loss is read at once (nothing to wait for); the tests here hold
CPU losses as a GPU's are held (`held_on_cpu`), and the counts of read-backs and the bits are what a GPU run depends on
(scripts/gpu_check.sh measures its time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import fit_step, trajectory
from torch.utils.data import TensorDataset

import legato
from legato.session import losses, telemetry
from legato.session.losses import LossBook, number
from legato.session.position import Metrics
from legato.store import trajectory as trajectory_file


@pytest.fixture(autouse=True)
def held_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold CPU losses as a GPU's are held (the tests of reading them at once turn it back on themselves)."""
    monkeypatch.setattr(losses, "READ_CPU_AT_ONCE", False)


def test_a_cpu_loss_is_read_at_once_with_the_bits_a_held_one_reads_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is held (a held loss a step lives until its read-back: work for the garbage collector), and the value is
    the one a held loss reads back, integer losses included."""
    monkeypatch.setattr(losses, "READ_CPU_AT_ONCE", True)
    tensors = [torch.tensor(0.1), torch.tensor(0.1, dtype=torch.bfloat16), torch.tensor([2.5], dtype=torch.float16), torch.tensor(3)]
    book = LossBook()
    taken = [book.take(t) for t in tensors]
    assert book._held == [] and all(type(v) is float for v in taken)
    assert [v.hex() for v in taken] == [v.hex() for v in losses.read_back([t.reshape(()) for t in tensors])]


def test_a_session_at_once_reads_no_cpu_loss_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(losses, "READ_CPU_AT_ONCE", True)
    reads: list[int] = []
    real = losses.read_back
    monkeypatch.setattr(losses, "read_back", lambda tensors: reads.append(len(tensors)) or real(tensors))
    model = torch.nn.Linear(3, 1)
    session = legato.Session(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), total_steps=12)
    seen = []
    for _ in session:
        loss = model(torch.ones(2, 3)).square().mean()
        seen.append(float(loss.detach()))
        session.report(loss)
    assert reads == [] and [r["loss_hex"] for r in trajectory(tmp_path, 0)] == [v.hex() for v in seen]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_held_loss_reads_back_the_bits_float_reads(dtype: torch.dtype) -> None:
    book = LossBook()
    tensors = [torch.randn((), generator=torch.Generator().manual_seed(i)).to(dtype) * 10 ** (i % 7 - 3) for i in range(20)]
    held = [book.take(t) for t in tensors]
    assert [h.hex() for h in held] == [float(t).hex() for t in tensors]


def test_a_loss_tensor_the_loop_writes_into_after_reporting_keeps_its_reported_value() -> None:
    book, running = LossBook(), torch.zeros(1)
    running += 3.25
    held = book.take(running)
    running.zero_()  # a gradient-accumulation loop resets its running loss at the next step
    assert held.value == 3.25


def test_the_sum_adds_held_and_plain_losses_in_the_order_reported() -> None:
    # Float addition does not commute with reordering: 1e16 + 1 - 1e16 is 0 in order and 1 in another.
    reported = [torch.tensor(1e16, dtype=torch.float64), 1.0, torch.tensor(-1e16, dtype=torch.float64), 0.5]
    book, metrics = LossBook(), Metrics()
    for loss in reported:
        metrics.add(book.take(loss))
    in_order = ((1e16 + 1.0) + -1e16) + 0.5
    assert metrics.values == {"loss_sum": in_order, "loss_count": 4}
    assert in_order != ((1e16 + -1e16) + 1.0) + 0.5  # the planted fault: summing the plain ones first gives other bits


def test_a_value_unread_when_its_line_is_written_is_read_then(tmp_path: Path) -> None:
    book, path = LossBook(), tmp_path / "rank0.jsonl"
    writer = trajectory_file.TrajectoryWriter(path, resume_step=0)
    held = book.take(torch.tensor(0.1))
    writer.write({"step": 1, "loss_hex": losses.hex_of(held)})
    assert not held.read
    writer.close()
    assert held.read and trajectory_file.read_trajectory(path) == [{"step": 1, "loss_hex": float(torch.tensor(0.1)).hex()}]


def test_a_session_reads_its_losses_back_at_its_captures_not_at_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 steps with a replay base every 16 and lines written only at the end: a handful of read-backs, each of every
    loss held since the last, and the trajectory, the sum and the replay's records hold the bits of float(loss)."""
    reads: list[int] = []
    real = losses.read_back
    monkeypatch.setattr(losses, "read_back", lambda tensors: reads.append(len(tensors)) or real(tensors))
    monkeypatch.setattr(trajectory_file, "FLUSH_INTERVAL_S", float("inf"))
    monkeypatch.setattr(telemetry, "PROGRESS_INTERVAL_S", float("inf"))
    data = TensorDataset(torch.randn(160, 3, generator=torch.Generator().manual_seed(0)), torch.randn(160, 1))
    model = torch.nn.Linear(3, 1)
    session = legato.Session(
        tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        total_steps=40,
        loader=legato.resumable_loader(data, batch_size=4, seed=1),
        checkpoint=legato.CheckpointPolicy(replay_steps=16, replay_cost=0, hash_every_steps=0),
    )
    seen = []
    for x, y in session:
        loss = fit_step(model, session.optimizer, x, y)
        seen.append(float(loss.detach()))
        session.report(loss)
    assert sum(reads) == 40 and 1 < len(reads) <= 5, reads
    assert [r["loss_hex"] for r in trajectory(tmp_path, 0)] == [v.hex() for v in seen]
    expected = 0.0
    for v in seen:
        expected += v
    assert session.metrics == {"loss_sum": expected, "loss_count": 40}
    assert number(None) is None


def test_a_learning_rate_held_as_a_tensor_is_written_with_each_step_value(tmp_path: Path) -> None:
    """A capturable optimizer's learning rate is a tensor, on the GPU there (its float would wait for the device at
    every step), which the scheduler writes into at every step: held like a loss, each line has its own step's value."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5**epoch)
    session = legato.Session(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler, total_steps=6)
    seen = []
    for _ in session:
        seen.append(float(optimizer.param_groups[0]["lr"]))
        model(torch.ones(2, 3)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        session.report(0.5)
    assert [r["lr"] for r in trajectory(tmp_path, 0)] == seen
    assert len(set(seen)) == 6, "every step's rate differs"
