"""The replay's batch fingerprint: every byte of a batch counts, and an older legato's fingerprints name no false cause.

Pure functions, one process; the planted faults a whole replay catches are in test_replay.py and test_replay_ddp.py.
"""

from __future__ import annotations

import pytest
import torch

from legato.session import replay
from legato.session.policy import CheckpointPolicy
from legato.session.replay import (
    FINGERPRINT_BYTES,
    NO_TENSORS,
    WHOLE_BYTES,
    HeldFingerprint,
    ReplayCheck,
    fingerprint,
    settle_record,
    step_record,
    take_fingerprint,
)
from legato.session.replay_base import ReplayBase


def _batch() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)]


def test_a_change_of_any_one_element_of_a_batch_changes_its_fingerprint() -> None:
    x, y = _batch()
    assert x.nbytes <= WHOLE_BYTES and x.nbytes > FINGERPRINT_BYTES, "the batch is one the old strided sample did not read whole"
    reference = fingerprint([x, y])
    # Element 1 lies between the old sample's elements (every 24th here): the old rule could not see it.
    for index in (0, 1, x.numel() // 2 + 7, x.numel() - 1):
        planted = x.clone()
        planted.view(-1)[index] = torch.nextafter(planted.view(-1)[index], torch.tensor(float("inf")))
        assert fingerprint([planted, y]) != reference, index
    assert fingerprint([x, y.flip(0)]) != reference
    assert fingerprint([x.clone(), y.clone()]) == reference


def test_dtype_shape_and_missing_tensors_count() -> None:
    x, y = _batch()
    reference = fingerprint([x, y])
    assert fingerprint([x.reshape(32, -1), y]) != reference
    assert fingerprint([x.view(torch.int32), y]) != reference
    assert fingerprint([x, y, None]) != reference
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # the same values in another memory order
    assert not strided.is_contiguous() and fingerprint([strided, y]) == reference


def test_a_tensor_above_the_whole_size_is_fingerprinted_by_its_strided_sample() -> None:
    big = torch.zeros(WHOLE_BYTES // 4 + 1024)
    reference = fingerprint([big])
    stride = -(-big.numel() // (FINGERPRINT_BYTES // 4))
    sampled, between = big.clone(), big.clone()
    sampled[stride] = 1.0
    between[1] = 1.0
    assert fingerprint([sampled]) != reference
    assert fingerprint([between]) == reference


def test_a_batch_that_differs_is_located_and_an_older_fingerprint_is_not_taken_for_one() -> None:
    x, y = _batch()
    ours, other = fingerprint([x, y]), fingerprint([x + 1, y])
    check = ReplayCheck(0, 4, 6, [step_record(5, 0.5, ours, None), step_record(6, 0.5, ours, None)], [])
    check.check(step_record(5, 0.5, ours, None))
    check.check(step_record(6, 0.5, other, None))
    assert check.report.batch_step == 6 and check.report.diverged
    # A record of a legato that fingerprinted with SHA-256 (16 hex digits): no rule in common, so no batch verdict;
    # the loss bits (and the digests at the end) still decide.
    older = ReplayCheck(0, 4, 5, [step_record(5, 0.5, "0123456789abcdef", None)], [])
    older.check(step_record(5, 0.5, ours, None))
    assert older.report.batch_step is None and not older.report.diverged
    older.check(step_record(5, 0.25, ours, None))
    assert older.report.loss_step == 5 and older.report.diverged


def test_a_held_fingerprint_is_the_one_taken_at_once_and_keeps_the_bytes_of_the_batch_as_yielded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device batch's fingerprint is held (its sample copied on the device) and hashed when asked for; held on the CPU
    here, it must give `fingerprint`'s value for every dtype and layout, whatever the loop writes into its batch after."""
    monkeypatch.setattr(replay, "HOLD_CPU", True)
    x, y = _batch()
    batches = [
        [x, y],
        [torch.zeros(WHOLE_BYTES // 4 + 1024)],  # fingerprinted by its strided sample
        [x.transpose(0, 1), torch.empty(0, 3)],  # not contiguous; no elements
        *[[x.to(dtype)] for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32, torch.bool)],
    ]
    for batch in batches:
        reference = fingerprint(batch)
        held = take_fingerprint(batch)
        assert isinstance(held, HeldFingerprint)
        for t in batch:  # the body writes into its batch (a normalization in place)
            if t.numel():
                first = (0,) * t.dim()
                t[first] = ~t[first] if t.dtype == torch.bool else t[first] + 1
        assert fingerprint(batch) != reference, "the write changes what an unheld fingerprint would read"
        assert held() == reference


def test_a_cpu_batch_is_fingerprinted_at_once_and_a_record_settles_its_held_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _batch()
    assert take_fingerprint([x, y]) == fingerprint([x, y]) and take_fingerprint([]) == NO_TENSORS
    monkeypatch.setattr(replay, "HOLD_CPU", True)
    record = step_record(5, 0.5, take_fingerprint([x, y]), None)
    settle_record(record)
    assert record["batch"] == fingerprint([x, y])


def test_a_long_window_reads_its_held_fingerprints_back_every_held_steps_and_saves_plain_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """However far apart the bases are, at most HELD_STEPS records hold a copy on the device; a share reads back the rest."""
    monkeypatch.setattr(replay, "HOLD_CPU", True)
    monkeypatch.setattr(replay, "HELD_STEPS", 3)
    base = ReplayBase(CheckpointPolicy(replay_steps=4), rank=0)
    assert base.snapshot is not None
    base.snapshot.step = 0
    model, batches = torch.nn.Linear(2, 1), [[torch.full((2, 2), float(i))] for i in range(1, 11)]
    most_held, grads = 0, []
    for step, batch in enumerate(batches, start=1):
        base.yielded(batch)
        model(batch[0]).sum().backward()  # the gradients accumulate: the first step's are not the last step's
        grads.append([p.grad.clone() for p in model.parameters()])
        base.record_step(step, 0.5, model)
        most_held = max(most_held, sum(isinstance(r["batch"], HeldFingerprint) for r in base.window))
    assert most_held == 3
    steps = base.share(None)["steps"]
    assert [r["batch"] for r in steps] == [fingerprint(batch) for batch in batches]
    assert steps[0]["grads"] == fingerprint(grads[0]) != fingerprint(grads[-1])  # the first step past the base's, held
    assert all("grads" not in r for r in steps[1:])


def test_held_copies_are_read_back_before_their_bytes_pass_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A big CPU tensor in a batch with device tensors is copied whole (up to WHOLE_BYTES): the bytes held bound the
    window too, not only its steps."""
    monkeypatch.setattr(replay, "HOLD_CPU", True)
    monkeypatch.setattr(replay, "HELD_BYTES", 3 * 4096)
    base = ReplayBase(CheckpointPolicy(replay_steps=4), rank=0)
    assert base.snapshot is not None
    base.snapshot.step = 0
    model, most_held = torch.nn.Linear(2, 1), 0
    for step in range(1, 11):
        base.yielded([torch.full((1024,), float(step))])  # 4 KiB
        base.record_step(step, 0.5, model)
        most_held = max(most_held, sum(r["batch"].nbytes for r in base.window if isinstance(r["batch"], HeldFingerprint)))
    assert most_held == 3 * 4096
