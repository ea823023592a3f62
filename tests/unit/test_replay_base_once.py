"""The replay base is written once: a checkpoint whose base is already on disk refers to it, and pruning keeps it.

One rank, no process group (the 2-rank runs are in test_replay_ddp.py). Real
stops: the process sends itself SIGUSR2 after the step named. Each scenario
resumes through the referred base and ends bitwise equal to an uninterrupted
run; the planted faults (a referred base altered or removed) are caught
before the replay: a checkpoint holding its own state (verify "warn") resumes
from it, loudly; a stop checkpoint holding its state by its replay (verify
"error") is skipped, and with nothing else to resume the run is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from helpers.replay_loops import train

from legato.errors import EXIT_OK, EXIT_STOPPED, UsageError
from legato.session.resume import pick
from legato.store import manifest as manifests

STEPS = 12


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())


def names(run_dir: Path, step: int) -> set[str]:
    return {p.name for p in (run_dir / "checkpoints" / f"step_{step}").iterdir()}


def trajectory(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / "rank0.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    assert train(run_dir, steps=STEPS).exit_code == EXIT_OK
    return run_dir


def assert_resumes_bitwise(run_dir: Path, reference: Path, from_step: int, steps: int) -> None:
    session = train(run_dir, steps=STEPS)
    assert session.exit_code == EXIT_OK and session.resumed is not None and session.resumed.match
    assert session.resumed.replay is not None and session.resumed.replay.identical
    assert (session.resumed.replay.from_step, session.resumed.replay.steps) == (from_step, steps)
    assert manifest(run_dir, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(run_dir) == trajectory(reference)


@pytest.mark.parametrize("verify", ["error", "warn"])
def test_a_base_that_is_an_earlier_checkpoint_is_referred_to_and_kept_from_pruning(tmp_path: Path, reference: Path, verify: str) -> None:
    """Checkpoints every 4 steps, keep_last 1: step 8's base is checkpoint 4, the stop at 10's base is checkpoint 8.

    Under verify "error" the stop holds its state by its replay and writes no file at all; under "warn" its own state."""
    stopped = train(tmp_path, signal_at=(10,), steps=STEPS, every_steps=4, keep_last=1, verify=verify)
    assert stopped.exit_code == EXIT_STOPPED
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_10", "step_8"]
    own = set() if verify == "error" else {"model.pt", "train_state.pt", "rank0.pt"}
    assert names(tmp_path, 10) == {*own, "manifest.json"}
    assert manifest(tmp_path, 10).get("state_by_replay", False) is (verify == "error")
    base = manifest(tmp_path, 10)["replay"]["base"]
    assert (base["dir"], base["prefix"]) == ("step_8", "")
    assert set(base["files"]) == {"model.pt", "train_state.pt", "rank0.pt"}
    assert manifest(tmp_path, 8)["replay"]["base"]["dir"] == "step_4"
    assert_resumes_bitwise(tmp_path, reference, 8, 2)


def test_selecting_a_stop_checkpoint_verifies_its_referred_base_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert train(tmp_path, signal_at=(10,), steps=STEPS, every_steps=4, keep_last=1).exit_code == EXIT_STOPPED
    verified: list[str] = []
    real = manifests._verify_file

    def counting(path: Path, info: dict) -> None:
        verified.append(f"{path.parent.name}/{path.name}")
        real(path, info)

    monkeypatch.setattr(manifests, "_verify_file", counting)
    path, picked, _ = pick(tmp_path / "checkpoints", 1, None)
    assert Path(path).name == "step_10" and picked["replay"]["base"]["dir"] == "step_8"
    assert sorted(verified) == ["step_8/model.pt", "step_8/rank0.pt", "step_8/train_state.pt"]


def test_a_base_written_by_one_checkpoint_is_referred_to_by_the_next(tmp_path: Path, reference: Path) -> None:
    """Stops at 6 and 7 share the base of step 4: step 6 writes it, step 7 (after a resume that replayed from it) refers to it."""
    assert train(tmp_path, signal_at=(6,), steps=STEPS, keep_last=1).exit_code == EXIT_STOPPED
    assert {"replay_model.pt", "replay_train_state.pt", "replay_rank0.pt"} <= names(tmp_path, 6)
    assert train(tmp_path, signal_at=(7,), steps=STEPS, keep_last=1).exit_code == EXIT_STOPPED
    assert not any(name.startswith("replay_") for name in names(tmp_path, 7))
    base = manifest(tmp_path, 7)["replay"]["base"]
    assert (base["dir"], base["prefix"]) == ("step_6", "replay_")
    assert manifest(tmp_path, 7)["replay"]["from_step"] == 4
    assert (tmp_path / "checkpoints" / "step_6").is_dir()  # keep_last 1, but step 7's base
    assert_resumes_bitwise(tmp_path, reference, 4, 3)


def test_a_final_checkpoint_carries_no_base(tmp_path: Path) -> None:
    assert train(tmp_path, steps=STEPS).exit_code == EXIT_OK
    assert "replay" not in manifest(tmp_path, STEPS)
    assert not any(name.startswith("replay_") for name in names(tmp_path, STEPS))


def plant(tmp_path: Path, fault: str) -> None:
    """Alter or remove checkpoint 6, which holds the replay base that checkpoint 7 refers to."""
    holder = tmp_path / "checkpoints" / "step_6"
    if fault == "removed":
        shutil.rmtree(holder)
        return
    data = bytearray((holder / "replay_model.pt").read_bytes())
    data[-100] ^= 1
    (holder / "replay_model.pt").write_bytes(bytes(data))


@pytest.mark.parametrize("fault", ["altered", "removed"])
def test_a_stop_checkpoint_whose_referred_base_is_altered_or_gone_is_refused_never_resumed_unproven(
    tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Stops at 6 and 7 under verify "error": both hold their state by their replay, so without the base neither can resume."""
    train(tmp_path, signal_at=(6,), steps=STEPS)
    train(tmp_path, signal_at=(7,), steps=STEPS)
    assert manifest(tmp_path, 7)["state_by_replay"] is True and names(tmp_path, 7) == {"manifest.json"}
    plant(tmp_path, fault)
    with caplog.at_level(logging.WARNING), pytest.raises(UsageError, match="cannot resume"):
        train(tmp_path, steps=STEPS)
    assert "skipping checkpoint" in caplog.text and "its state is held by its replay, and its replay base in" in caplog.text


@pytest.mark.parametrize("fault", ["altered", "removed"])
def test_a_referred_base_that_is_altered_or_gone_is_caught_and_the_checkpoint_itself_resumes(
    tmp_path: Path, reference: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under verify "warn" a stop checkpoint holds its own state too: that state resumes, verified by its digests."""
    train(tmp_path, signal_at=(6,), steps=STEPS, verify="warn")
    train(tmp_path, signal_at=(7,), steps=STEPS, verify="warn")
    plant(tmp_path, fault)
    with caplog.at_level(logging.WARNING):
        session = train(tmp_path, steps=STEPS, verify="warn")
    assert "its replay base in" in caplog.text and "without a replay" in caplog.text
    assert session.resumed is not None and session.resumed.match and session.resumed.replay is None
    assert session.resumed.step == 7
    assert manifest(tmp_path, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
