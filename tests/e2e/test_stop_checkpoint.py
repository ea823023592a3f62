"""The stop checkpoint writes the state once: 2 real ranks (gloo), SIGUSR2 and SIGKILL sent from here by pid.

tests/helpers/stop_once.py runs a DDP loop with a replay base every 4 steps. A stop checkpoint under
checkpoint.verify "error" holds only its replay base and the steps' records (`state_by_replay` in its manifest),
so its files are about 1x the state, where a checkpoint holding its state and its base (verify "warn") is 2x.
Checked:

- the stop checkpoint's files are all replay-base files and weigh about what one full state weighs (the final
  checkpoint's), about half of what the same stop writes under verify "warn";
- the resume replays from the base and ends bit for bit where an uninterrupted run ends (global hash and every
  step's trajectory record);
- a base already on disk (a periodic checkpoint's own state) is referred to: the stop checkpoint writes no file,
  and the base is kept from pruning while it is referred to;
- a hard kill (SIGKILL) during the replay leaves the checkpoint standing, and the next attempt replays it again;
- planted fault: the step made non-deterministic after the stop exits 3 with one paragraph, under verify "warn"
  too (there is no saved state to fall back to), and leaves every saved byte as it was;
- a resume with replay off (replay_steps=0) is refused: exit 2, one paragraph naming the cause and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
from conftest import ROOT, manifest
from helpers.cli import ledger, wait_for
from helpers.launches import catches_usr2, reaped, start_ranks, steps_done

from legato.voice import counted

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "stop_once.py"
STEPS = 24


def run(out: Path, **env: str) -> list[int]:
    with reaped(start_ranks(SCRIPT, out, 2, **env)) as procs:
        return [p.wait(timeout=300) for p in procs]


def stop_from_outside(out: Path, **env: str) -> list[int]:
    """Start 2 ranks, send SIGUSR2 to rank 1's pid once 6 steps ran, and wait for them."""
    with reaped(start_ranks(SCRIPT, out, 2, LEGATO_CHAOS_STEP_SLEEP_S="0.2", **env)) as procs:
        wait_for(lambda: all(catches_usr2(p.pid) for p in procs), 300, "the Session's stop handler")
        wait_for(lambda: steps_done(out) >= 6, 300, "six steps")
        os.kill(procs[1].pid, signal.SIGUSR2)
        return [p.wait(timeout=300) for p in procs]


def stderr(out: Path, rank: int = 0) -> str:
    return (out / f"rank{rank}.stderr").read_text()


def records(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()]


def checkpoint_bytes(out: Path, step: int) -> int:
    return sum(info["bytes"] for info in manifest(out, step)["files"].values())


def saved(out: Path) -> dict[str, str]:
    """Every file under the run's checkpoints, by path, with the SHA-256 of its bytes."""
    root = out / "checkpoints"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def stopped(out: Path, **env: str) -> dict:
    """Stop a run from outside; the manifest of its stop checkpoint."""
    assert stop_from_outside(out, **env) == [75, 75], stderr(out)[-3000:]
    return manifest(out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    assert run(out) == [0, 0], stderr(out)[-3000:]
    return out


def test_the_stop_checkpoint_holds_its_base_once_and_the_resume_replays_bitwise(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    stop = stopped(out)
    step, base = stop["step"], stop["replay"]["from_step"]
    assert stop["state_by_replay"] is True and stop["reason"] == "signal"
    assert base < step and "base" not in stop["replay"]  # the base (not on disk before) is in the stop checkpoint itself
    assert stop["files"] and all(name.startswith("replay_") for name in stop["files"])
    full = checkpoint_bytes(reference, STEPS)  # the final checkpoint: one full state, no base
    assert 0.9 * full < checkpoint_bytes(out, step) < 1.1 * full

    warn = tmp_path / "warn"
    both = stopped(warn, VERIFY="warn")
    assert "state_by_replay" not in both and any(not name.startswith("replay_") for name in both["files"])
    assert checkpoint_bytes(warn, both["step"]) > 1.8 * full  # its own state and its base: what the stop no longer writes
    # The run's record of each stop says whether it holds its state as a replay, and from which step (the supervisor's line).
    assert [e.get("replays_from") for e in ledger(out) if e["event"] == "checkpoint_committed"] == [base]
    assert [e.get("replays_from") for e in ledger(warn) if e["event"] == "checkpoint_committed"] == [None]

    assert run(out) == [0, 0], stderr(out)[-3000:]
    assert f"resumed at step {step}" in stderr(out)
    assert f"verified by a replay of {counted(step - base, 'step')} from step {base}" in stderr(out)
    assert manifest(out, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]
    for rank in range(2):
        assert records(out, rank) == records(reference, rank)


def test_a_base_on_disk_is_referred_to_and_kept_while_referred(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    # A periodic checkpoint every 4 steps is the base of the next stop (replay_steps 4): the stop writes no file at all.
    stop = stopped(out, EVERY_STEPS="4", KEEP_LAST="1")
    step, base = stop["step"], stop["replay"]["from_step"]
    assert base == 4 * ((step - 1) // 4) and base >= 4  # the stop lands after step 6: its base is a periodic checkpoint's state
    assert stop["state_by_replay"] is True and stop["files"] == {}
    assert stop["replay"]["base"]["dir"] == f"step_{base}" and stop["replay"]["base"]["prefix"] == ""
    assert (out / "checkpoints" / f"step_{base}" / "manifest.json").is_file()  # keep_last 1, yet kept: it is referred to
    committed = [e for e in ledger(out) if e["event"] == "checkpoint_committed"]
    assert committed[-1]["step"] == step and committed[-1]["replays_from"] == base and committed[-1]["bytes"] == 0
    assert all(e.get("replays_from") is None for e in committed[:-1])  # the periodic checkpoints hold their own state
    assert run(out, EVERY_STEPS="4", KEEP_LAST="1") == [0, 0], stderr(out)[-3000:]
    assert f"verified by a replay of {counted(step - base, 'step')} from step {base}" in stderr(out)
    assert manifest(out, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]


def test_a_hard_kill_during_the_replay_leaves_the_checkpoint_to_replay_again(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    stop = stopped(out)
    before = saved(out)
    with reaped(start_ranks(SCRIPT, out, 2, LEGATO_CHAOS_STEP_SLEEP_S="1.0")) as procs:
        wait_for(lambda: "replaying steps" in stderr(out), 300, "the replay to start")
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        assert [p.wait(timeout=60) for p in procs] == [-signal.SIGKILL] * 2
    assert saved(out) == before
    assert run(out) == [0, 0], stderr(out)[-3000:]
    assert f"resumed at step {stop['step']}" in stderr(out) and "verified by a replay" in stderr(out)
    assert manifest(out, STEPS)["global_hash"] == manifest(reference, STEPS)["global_hash"]


@pytest.mark.parametrize("verify", ["error", "warn"])
def test_a_step_made_nondeterministic_after_the_stop_exits_3_and_harms_nothing(tmp_path: Path, verify: str) -> None:
    out = tmp_path / "run"
    stop = stopped(out)
    before = saved(out)
    assert run(out, FAULT="1", VERIFY=verify) == [3, 3]
    for rank in range(2):
        text = stderr(out, rank)
        assert f"Resume verification failed at step {stop['step']}" in text and "diverged first at step" in text, text[-3000:]
        assert "no saved state to fall back to" in text and "Traceback" not in text
    assert saved(out) == before


def test_a_resume_with_replay_off_is_refused_naming_the_cause_and_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "run"
    stop = stopped(out)
    before = saved(out)
    assert run(out, REPLAY_STEPS="0") == [2, 2]
    text = stderr(out)
    assert f"Checkpoint {out / 'checkpoints' / ('step_' + str(stop['step']))} is a stop checkpoint" in text
    assert "replay is off (replay_steps=0)" in text and "replay_steps=32" in text and "Traceback" not in text
    assert saved(out) == before
