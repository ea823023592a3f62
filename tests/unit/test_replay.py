"""Replay-verified resume in one process: planted faults outside the checkpoint are caught, named and located.

One rank, no subprocess, no process group (the 2-rank versions with real
processes are in test_replay_ddp.py). The loops are in replay_loops.py. A stop
is real: the process sends itself SIGUSR2 after step 7 and the session stops
there with a barrier checkpoint whose replay base is step 4 (replay_steps 4);
the resume replays steps 5..7 through the same user loop.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from helpers.replay_loops import train

import legato
from legato.errors import EXIT_OK, EXIT_STOPPED, UsageError
from legato.session import replay

STEPS = 12
STOP = 7

# loop -> (first divergent step, words of the cause). An unfinished accumulation's .grad sums are
# no longer outside the checkpoint (the session saves every .grad): see the accumulate tests below.
FAULTS = {
    "prefetch": (5, "a prefetched batch"),
    "generator": (5, "torch.Generator"),
    "worker_rng": (5, "inside DataLoader workers"),
}


def trajectory(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / "rank0.jsonl").read_text().splitlines()]


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())


@pytest.mark.parametrize("loop", sorted(FAULTS))
def test_state_outside_the_checkpoint_is_caught_by_the_replay(tmp_path: Path, loop: str) -> None:
    first = train(tmp_path, loop, signal_at=(STOP,), steps=STEPS)
    assert first.exit_code == EXIT_STOPPED and first.step == STOP
    with pytest.raises(legato.ResumeMismatchError) as caught:
        train(tmp_path, loop, steps=STEPS)
    step, cause = FAULTS[loop]
    message = str(caught.value)
    assert f"replay of steps 5..{STOP} diverged first at step {step} on rank 0" in message, message
    assert cause in message, message


def test_an_unfinished_accumulation_resumes_exactly_without_registering_its_gradients(tmp_path: Path) -> None:
    """Stopped between no_sync micro-steps (step 7 of 3-step accumulations): the partial .grad sums are saved and restored."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert train(reference, "accumulate", steps=STEPS).exit_code == EXIT_OK
    # Under verify "warn" the stop checkpoint holds its own state at STOP (under "error" only its replay base: the grads'
    # digest at STOP, proven by the replay).
    assert train(resumed, "accumulate", signal_at=(STOP,), steps=STEPS, verify="warn").exit_code == EXIT_STOPPED
    assert "grads" in manifest(resumed, STOP)["ranks"][0]["components"]
    saved = torch.load(resumed / "checkpoints" / f"step_{STOP}" / "rank0.pt", weights_only=True)["grads"]["grads"]
    assert all(g is not None for g in saved)
    session = train(resumed, "accumulate", steps=STEPS)
    assert session.resumed is not None and session.resumed.match and session.resumed.replay.identical
    assert manifest(resumed, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(resumed) == trajectory(reference)


def test_gradients_left_unrestored_are_caught_and_named(tmp_path: Path) -> None:
    """The planted fault for the gradients component: a resume that skips it fails, naming it.

    The stop is written under verify "warn", so that it holds its own state and a resume with replay off can restore it."""
    train(tmp_path, "accumulate", signal_at=(STOP,), steps=STEPS, verify="warn")
    with pytest.raises(legato.ResumeMismatchError) as caught:
        train(tmp_path, "accumulate", steps=STEPS, replay_steps=0, chaos=legato.Chaos(skip_restore=frozenset({"grads"})))
    assert "Differing components: rank 0: grads" in str(caught.value)


@pytest.mark.parametrize("loop", sorted([*FAULTS, "accumulate"]))
def test_the_same_loop_with_its_state_registered_replays_identical_and_ends_bitwise_equal(tmp_path: Path, loop: str) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert train(reference, loop, register=True, steps=STEPS).exit_code == EXIT_OK
    assert train(resumed, loop, register=True, signal_at=(STOP,), steps=STEPS).exit_code == EXIT_STOPPED
    session = train(resumed, loop, register=True, steps=STEPS)
    assert session.exit_code == EXIT_OK
    assert session.resumed is not None and session.resumed.match and session.resumed.step == STOP
    assert session.resumed.replay is not None and session.resumed.replay.identical
    assert (session.resumed.replay.from_step, session.resumed.replay.steps) == (4, 3)
    assert manifest(resumed, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(resumed) == trajectory(reference)


@pytest.mark.parametrize("verify", ["error", "warn"])
def test_checkpoint_carries_the_replay_base_and_the_records(tmp_path: Path, verify: str) -> None:
    """Under verify "error" the stop checkpoint holds its base only (its state by its replay); under "warn" its own state too."""
    train(tmp_path, signal_at=(STOP,), steps=STEPS, verify=verify)
    step_dir = tmp_path / "checkpoints" / f"step_{STOP}"
    names = {p.name for p in step_dir.iterdir()}
    own = {"model.pt", "train_state.pt", "rank0.pt"} if verify == "warn" else set()
    assert {*own, "replay_model.pt", "replay_train_state.pt", "replay_rank0.pt", "manifest.json"} == names
    m = manifest(tmp_path, STOP)
    assert m.get("state_by_replay", False) is (verify == "error")
    assert m["replay"]["from_step"] == 4
    base = m["replay"]["ranks"][0]
    assert set(base["components"]) == set(m["ranks"][0]["components"])
    assert [r["step"] for r in base["steps"]] == [5, 6, 7]
    assert [r["loss_hex"] for r in base["steps"]] == [r["loss_hex"] for r in trajectory(tmp_path)[4:7]]
    assert torch.load(step_dir / "replay_train_state.pt", weights_only=True)["counters"]["step"] == 4


def test_replay_off_resumes_from_the_checkpoint_alone(tmp_path: Path) -> None:
    train(tmp_path, "generator", signal_at=(STOP,), steps=STEPS, replay_steps=0)
    assert "replay" not in manifest(tmp_path, STOP)
    session = train(tmp_path, "generator", steps=STEPS, replay_steps=0)
    assert session.resumed is not None and session.resumed.match and session.resumed.replay is None
    assert session.resumed.seconds > 0  # selecting, restoring and checking took some time, and the Session says how much


@pytest.mark.parametrize("component", ["rng.torch", "optimizer"])
def test_a_skipped_restore_is_named_by_the_digest_check_and_located_by_the_replay(tmp_path: Path, component: str) -> None:
    train(tmp_path, "generator", register=True, signal_at=(STOP,), steps=STEPS)
    with pytest.raises(legato.ResumeMismatchError) as caught:
        train(tmp_path, "generator", register=True, steps=STEPS, chaos=legato.Chaos(skip_restore=frozenset({component})))
    message = str(caught.value)
    assert f"Differing components: rank 0: {component}." in message
    assert "diverged first at step" in message and f"left {component} unrestored" in message


def test_rng_drawn_after_the_restore_is_caught_by_the_replay(tmp_path: Path) -> None:
    train(tmp_path, signal_at=(STOP,), steps=STEPS)
    with pytest.raises(legato.ResumeMismatchError) as caught:
        train(tmp_path, steps=STEPS, chaos=legato.Chaos(consume_rng_after_restore=("torch",)))
    assert "diverged first at step 5" in str(caught.value)
    assert "random numbers were drawn between the restore and the first step" in str(caught.value)


def test_verify_warn_loads_the_checkpoint_after_a_diverged_replay(tmp_path: Path) -> None:
    train(tmp_path, "generator", signal_at=(STOP,), steps=STEPS, verify="warn")
    session = train(tmp_path, "generator", steps=STEPS, verify="warn")
    assert session.exit_code == EXIT_OK and session.resumed is not None
    assert not session.resumed.match and session.resumed.step == STOP
    assert session.resumed.replay is not None and session.resumed.replay.first_divergence["step"] == 5
    assert [r["step"] for r in trajectory(tmp_path)] == list(range(1, STEPS + 1))


def test_verify_warn_refuses_a_diverged_replay_of_a_checkpoint_held_by_its_replay(tmp_path: Path) -> None:
    """Stopped under verify "error", the checkpoint has no state at STOP to fall back to: a divergence refuses under "warn" too."""
    train(tmp_path, "generator", signal_at=(STOP,), steps=STEPS)
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / f"step_{STOP}").iterdir()}
    with pytest.raises(legato.ResumeMismatchError, match="no saved state to fall back to"):
        train(tmp_path, "generator", steps=STEPS, verify="warn")
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoints" / f"step_{STOP}").iterdir()} == before


def test_a_stop_during_the_replay_leaves_the_checkpoint_and_the_next_resume_replays_again(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    train(reference, steps=STEPS)
    run_dir = tmp_path / "run"
    train(run_dir, signal_at=(STOP,), steps=STEPS)
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())

    def signal_in_replay(session: legato.Session) -> None:
        if session.replaying and session.step == 4:
            os.kill(os.getpid(), signal.SIGUSR2)

    stopped = train(run_dir, steps=STEPS, on_step=signal_in_replay)
    assert stopped.exit_code == EXIT_STOPPED and stopped.resumed is None and stopped.step == 5
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    finished = train(run_dir, steps=STEPS)
    assert finished.resumed is not None and finished.resumed.match and finished.resumed.replay.identical
    assert manifest(run_dir, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(run_dir) == trajectory(reference)


@pytest.mark.parametrize("steps, replay_steps, cause", [(STOP, 4, f"this run ends at step {STOP}"), (STEPS, 0, "replay is off")])
def test_a_resume_that_cannot_replay_a_checkpoint_held_by_its_replay_is_refused(
    tmp_path: Path, steps: int, replay_steps: int, cause: str
) -> None:
    """Nothing left to train, or replay off: the stop checkpoint's state at STOP exists only as its replay, so no resume."""
    train(tmp_path, signal_at=(STOP,), steps=STEPS)
    assert manifest(tmp_path, STOP)["state_by_replay"] is True
    with pytest.raises(UsageError, match=f"is a stop checkpoint: it holds its state at step {STOP} only as its replay base") as caught:
        train(tmp_path, steps=steps, replay_steps=replay_steps)
    assert cause in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [f"step_{STOP}"]


@pytest.fixture
def held_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Hold CPU batches' fingerprints as a GPU batch's are held; counts the held fingerprints read back."""
    monkeypatch.setattr(replay, "HOLD_CPU", True)
    reads: list[int] = []
    real = replay.HeldFingerprint.__call__
    monkeypatch.setattr(replay.HeldFingerprint, "__call__", lambda held: reads.append(1) or real(held))
    return reads


def test_held_batch_fingerprints_name_a_batch_drawn_from_unsaved_randomness(tmp_path: Path, held_batches: list[int]) -> None:
    assert train(tmp_path, "worker_rng", signal_at=(STOP,), steps=STEPS).exit_code == EXIT_STOPPED
    with pytest.raises(legato.ResumeMismatchError) as caught:
        train(tmp_path, "worker_rng", steps=STEPS)
    step, cause = FAULTS["worker_rng"]
    assert f"diverged first at step {step} on rank 0" in str(caught.value) and cause in str(caught.value)
    assert held_batches, "the fingerprints were held and read back"


def test_fingerprints_held_before_the_stop_are_the_ones_a_resume_takes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_batches: list[int]
) -> None:
    """The stop's records hold fingerprints read back from held copies; the resume fingerprints its batches at once, and
    its replay finds every batch the same, ending bitwise where the uninterrupted run does."""
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert train(resumed, "plain", signal_at=(STOP,), steps=STEPS).exit_code == EXIT_STOPPED
    assert held_batches
    steps = manifest(resumed, STOP)["replay"]["ranks"][0]["steps"]
    assert [type(r["batch"]) for r in steps] == [str, str, str]
    monkeypatch.setattr(replay, "HOLD_CPU", False)
    assert train(reference, "plain", steps=STEPS).exit_code == EXIT_OK
    session = train(resumed, "plain", steps=STEPS)
    assert session.resumed is not None and session.resumed.match and session.resumed.replay.identical
    assert session.resumed.replay.steps == 3
    assert manifest(resumed, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    assert trajectory(resumed) == trajectory(reference)
