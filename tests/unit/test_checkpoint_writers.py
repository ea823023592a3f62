"""The periodic checkpoint writers alone (legato.store.writers): both drivers through the same phases, as a Session
asks them, on one rank with no process group (world size 1) and no Session.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from legato.dist.stop import Decision
from legato.state.snapshot import Snapshot
from legato.store.async_checkpoint import AsyncCheckpointer, Job
from legato.store.commit import Committed, NotWritten
from legato.store.manifest import list_checkpoints
from legato.store.writers import Synchronous, Writer


def periodic_checkpoint(
    writer: Writer, step: int, weight: torch.Tensor, replay: Callable[[], dict | None] = lambda: None
) -> Snapshot | None:
    """A periodic checkpoint due at `step`, as the Session hands it to its writer: make room, stage, start. `replay`: the
    replay base share the worker builds first (a test plants a failure there)."""
    assert writer.make_room(step) is None  # nothing in flight before it
    staged = writer.stage(step, {"model": {"w": weight}}, lambda: ({"model.pt": {"w": weight}}, set()))
    if staged is not None:
        writer.start(Job(step, staged, dict(staged.files), replay, {"reason": "periodic"}, (staged,), staged.copy_s))
    return staged


def test_the_synchronous_writer_stages_nothing_and_is_settled_at_every_boundary() -> None:
    writer = Synchronous()
    assert periodic_checkpoint(writer, 2, torch.arange(4.0)) is None  # the loop writes from the live state itself
    assert writer.votes() == {}
    assert writer.settle(Decision(stop=False, checkpoint_due=False, checked_at=3)) is None
    assert writer.lend_staged(2, lambda buffer: buffer) is False
    assert writer.finish() is None
    writer.close()


def test_the_background_writer_writes_its_staged_copy_and_commits_at_an_agreed_boundary(tmp_path: Path) -> None:
    writer = AsyncCheckpointer(tmp_path, 0, 1, None, keep_last=2, kill=None)
    try:
        weight = torch.arange(4.0)
        staged = periodic_checkpoint(writer, 2, weight)
        assert staged is not None and staged.step == 2
        weight.add_(1)  # training goes on: the write holds step 2's values
        assert set(writer.votes()) == {"writing_local", "failed_local"} and not writer.votes()["failed_local"]
        # An agreement started at the checkpoint's own step cannot say its files are durable: nothing commits yet.
        assert writer.settle(Decision(stop=False, checkpoint_due=False, checked_at=2)) is None
        assert list_checkpoints(tmp_path) == []  # in flight: never selectable
        outcome = writer.finish()
        assert isinstance(outcome, Committed) and outcome.step == 2, outcome
        assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2"]
        assert writer.votes() == {"writing_local": False, "failed_local": False}
        assert torch.equal(staged.files["model.pt"]["w"], torch.arange(4.0))
    finally:
        writer.close()


def test_the_background_writer_lends_only_the_copy_staged_at_the_base_step(tmp_path: Path) -> None:
    """The replay base taken at the step just staged shares its copy (`lend_staged`), and hands back the buffer the
    next checkpoint stages into; at any other step, or with nothing in flight, nothing is lent."""
    writer = AsyncCheckpointer(tmp_path, 0, 1, None, keep_last=2, kill=None)
    spare, lent = Snapshot(), []
    swap = lambda buffer: (lent.append(buffer), spare)[1]  # noqa: E731
    try:
        assert writer.lend_staged(2, swap) is False  # nothing staged yet
        staged = periodic_checkpoint(writer, 2, torch.arange(4.0))
        assert writer.lend_staged(3, swap) is False and lent == []
        assert writer.lend_staged(2, swap) is True and lent == [staged] and writer.staging is spare
        assert isinstance(writer.finish(), Committed)
        assert writer.lend_staged(2, swap) is False  # committed: nothing in flight to share
    finally:
        writer.close()


def test_a_failed_background_write_is_abandoned_only_once_no_rank_writes_and_a_full_disk_is_named(tmp_path: Path) -> None:
    writer = AsyncCheckpointer(tmp_path, 0, 1, None, keep_last=2, kill=None)
    go = threading.Event()

    def disk_full() -> None:
        go.wait(timeout=60)
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        periodic_checkpoint(writer, 2, torch.arange(4.0), replay=disk_full)
        # Some rank failed while another still writes: the directory stays until every worker is done with it.
        assert writer.settle(Decision(stop=False, checkpoint_due=False, writing=True, failed=True, checked_at=3)) is None
        assert (tmp_path / ".tmp_step_2").is_dir() and writer.busy
        go.set()
        for _ in range(6000):  # the worker fails as soon as it is let go; bounded at a minute
            if writer.votes()["failed_local"]:
                break
            time.sleep(0.01)
        outcome = writer.settle(Decision(stop=False, checkpoint_due=False, failed=True, checked_at=4))
        assert isinstance(outcome, NotWritten) and outcome.errors == {0: "[Errno 28] No space left on device"}, outcome
        assert "free space" in outcome.fix and not (tmp_path / ".tmp_step_2").exists() and not writer.busy
    finally:
        go.set()
        writer.close()


def test_a_bug_in_the_background_writer_is_raised_not_reported_as_a_full_disk(tmp_path: Path) -> None:
    writer = AsyncCheckpointer(tmp_path, 0, 1, None, keep_last=2, kill=None)

    def bug() -> None:
        raise KeyError("a record the replay share expected")

    try:
        periodic_checkpoint(writer, 2, torch.arange(4.0), replay=bug)
        with pytest.raises(KeyError, match="a record the replay share expected"):
            writer.finish()
        assert list_checkpoints(tmp_path) == [] and not (tmp_path / ".tmp_step_2").exists()
    finally:
        writer.close()
