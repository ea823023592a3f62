"""A resume loads its checkpoint first and verifies the files after, before anything is restored.

One rank, no process group, in-process Sessions with real stops (the process
sends itself SIGUSR2 after the step named); the 2-rank path, where every rank
hashes its share, is in tests/e2e/test_verified_together.py. Spies record the
order of the load (`legato.store.layout.load`), of each file's hash pass and of
the restore into the live objects; they change nothing. The planted fault is a
flipped byte inside a tensor's bytes, which torch.load reads without complaint:
only the verification after the load catches it, and the run must resume from
the checkpoint before, never from the altered one, under verify "warn" too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers.replay_loops import train

from legato.errors import EXIT_OK, EXIT_STOPPED
from legato.state import components
from legato.store import layout
from legato.store import manifest as manifests

STEPS = 12


def checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step}"


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((checkpoint(run_dir, step) / "manifest.json").read_text())


@pytest.fixture
def order(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What the resume did, in order: ("load", directory/prefix), ("verify", directory/file), ("restore", "")."""
    seen: list[tuple[str, str]] = []
    load, verify, restore = layout.load, manifests._verify_file, components.restore

    def loading(table, path: Path, rank: int, prefix: str = ""):
        seen.append(("load", f"{path.name}/{prefix}"))
        return load(table, path, rank, prefix)

    def verifying(path: Path, info: dict) -> None:
        seen.append(("verify", f"{path.parent.name}/{path.name}"))
        verify(path, info)

    def restoring(*args, **kwargs):
        seen.append(("restore", ""))
        return restore(*args, **kwargs)

    monkeypatch.setattr(layout, "load", loading)
    monkeypatch.setattr(manifests, "_verify_file", verifying)
    monkeypatch.setattr(components, "restore", restoring)
    return seen


def assert_loaded_verified_restored(order: list[tuple[str, str]], loaded: str, files: list[str]) -> None:
    """Up to the first restore: one load of `loaded`, then each of `files` verified once (the biggest first), nothing else."""
    resumed = order[: order.index(("restore", "")) + 1]
    assert resumed[0] == ("load", loaded) and resumed[-1] == ("restore", "")
    assert sorted(resumed[1:-1]) == sorted(("verify", name) for name in files)


def test_a_resume_loads_once_then_verifies_every_file_once_before_restoring(tmp_path: Path, order: list[tuple[str, str]]) -> None:
    assert train(tmp_path, signal_at=(6,), steps=STEPS, replay_steps=0).exit_code == EXIT_STOPPED
    files = sorted(manifest(tmp_path, 6)["files"])
    order.clear()
    session = train(tmp_path, steps=STEPS, replay_steps=0)
    assert session.exit_code == EXIT_OK and session.resumed is not None and session.resumed.match
    assert_loaded_verified_restored(order, "step_6/", [f"step_6/{name}" for name in files])


def test_a_replayed_resume_loads_its_base_once_and_verifies_what_the_checkpoint_rests_on(
    tmp_path: Path, order: list[tuple[str, str]]
) -> None:
    """The stop at 10 holds its state by its replay; its base is checkpoint 8, which it refers to."""
    assert train(tmp_path, signal_at=(10,), steps=STEPS, every_steps=4).exit_code == EXIT_STOPPED
    base = manifest(tmp_path, 10)["replay"]["base"]
    assert base["dir"] == "step_8" and manifest(tmp_path, 10)["files"] == {}
    order.clear()
    session = train(tmp_path, steps=STEPS)
    assert session.exit_code == EXIT_OK and session.resumed is not None and session.resumed.match
    assert session.resumed.replay is not None and session.resumed.replay.identical
    assert_loaded_verified_restored(order, "step_8/", [f"step_8/{name}" for name in base["files"]])


def flip_a_tensor_byte(path: Path) -> None:
    """Flip one byte in the middle of the file's largest tensor: the file still loads, its values differ."""
    largest = max(torch.load(path, weights_only=True).values(), key=lambda t: t.nbytes)
    data = bytearray(path.read_bytes())
    offset = data.find(largest.numpy().tobytes())
    assert offset > 0 and data.find(largest.numpy().tobytes(), offset + 1) == -1
    data[offset + largest.nbytes // 2] ^= 0x10
    path.write_bytes(bytes(data))
    assert not torch.equal(max(torch.load(path, weights_only=True).values(), key=lambda t: t.nbytes), largest)


@pytest.mark.parametrize("verify", ["error", "warn"])
def test_a_file_that_loads_but_does_not_verify_is_never_restored_and_the_checkpoint_before_resumes(
    tmp_path: Path, order: list[tuple[str, str]], caplog: pytest.LogCaptureFixture, verify: str
) -> None:
    reference = tmp_path / "reference"
    assert train(reference, steps=STEPS, replay_steps=0).exit_code == EXIT_OK
    run = tmp_path / "run"
    assert train(run, signal_at=(10,), steps=STEPS, every_steps=4, replay_steps=0, verify=verify).exit_code == EXIT_STOPPED
    flip_a_tensor_byte(checkpoint(run, 10) / "model.pt")
    order.clear()
    with caplog.at_level(logging.WARNING):
        session = train(run, steps=STEPS, every_steps=4, replay_steps=0, verify=verify)
    assert f"skipping checkpoint {checkpoint(run, 10)}: model.pt does not match its XXH3-128 in the manifest" in caplog.text
    assert session.exit_code == EXIT_OK and session.resumed is not None and session.resumed.match
    assert session.resumed.step == 8
    first_restore = order.index(("restore", ""))
    assert order[0] == ("load", "step_10/")  # loaded first, caught after:
    assert order.index(("verify", "step_10/model.pt")) < order.index(("load", "step_8/")) < first_restore  # nothing of step 10 restored
    assert manifest(run, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
