"""The checkers catch planted faults, and bad input fails cleanly.

Real processes and real signals throughout: a skipped RNG restore must be
named by the restore check, a flipped byte must make resume fall back, a
SIGKILL in the middle of a checkpoint write must leave the previous one
usable, and every bad input must exit 2 with one paragraph and no traceback.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    FAST_GPT,
    ROOT,
    TINY_GPT,
    assert_bitwise_equal,
    codes,
    gpt_reference,
    manifest,
    resumed_steps,
    run_ranks,
    run_to_completion,
    run_trainer,
)
from helpers.shared_runs import SharedRuns, run_key

from legato.store.manifest import manifest_checksum

STEPS = 30


@pytest.fixture
def reference(shared_runs: SharedRuns) -> Path:
    return gpt_reference(shared_runs)


def stop_once(shared_runs: SharedRuns, run_dir: Path, at: int, *sets: str) -> None:
    """`run_dir` becomes a copy of the run stopped at a checkpoint after step `at` (trained once per suite for these
    settings: the tests damage or resume their own copy)."""

    def build(into: Path) -> None:
        first = run_trainer(TINY_GPT, into, *FAST_GPT, f"chaos.signal_at_steps=[{at - 1}]", *sets)
        assert first.returncode == 75, first.stderr[-2000:]

    shared_runs.copy_of(run_key("stop_once", str(at), *sets), build, run_dir)


@pytest.mark.slow
# rng.torch is caught in-process by test_session_table and named by test_verify; these two need real processes.
@pytest.mark.parametrize("component", ["rng.python", "rng.numpy"])
def test_restore_check_names_an_unrestored_rng_component(shared_runs: SharedRuns, tmp_path: Path, component: str) -> None:
    stop_once(shared_runs, tmp_path, 9)
    resumed = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, f"chaos.skip_restore=[{component}]")
    assert resumed.returncode == 3
    assert f"Differing components: rank 0: {component}; rank 1: {component}." in resumed.stderr
    # The replay of the steps since the base sees it too, and names it as unrestored.
    assert "the replay of steps" in resumed.stderr and f"left {component} unrestored" in resumed.stderr
    assert "Traceback" not in resumed.stderr


@pytest.mark.slow
def test_verify_warn_mode_continues_past_a_mismatch(shared_runs: SharedRuns, tmp_path: Path) -> None:
    # Stopped under "warn" too, so that the checkpoint holds its own state to continue from (a stop under "error" holds
    # it only by its replay, and a mismatch then refuses under "warn" as well: tests/e2e/test_stop_checkpoint.py).
    stop_once(shared_runs, tmp_path, 9, "checkpoint.verify=warn")
    resumed = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, "chaos.skip_restore=[rng.torch]", "checkpoint.verify=warn")
    assert resumed.returncode == 0
    assert "Continuing unverified by checkpoint.verify: warn: continued unverified at step 9: " in resumed.stderr
    assert "rng.torch (checkpoint.verify: warn)" in resumed.stderr
    # Carried by every later checkpoint, so that no later resume claims bitwise continuity with the run's start.
    assert manifest(tmp_path)["unverified"]["how"] == "checkpoint.verify: warn"


@pytest.mark.slow
# The stop checkpoint at 13 holds its state by its replay: its files are its replay base's (step 12), under replay_.
@pytest.mark.parametrize("victim", ["replay_rank1.pt", "replay_model.pt", "manifest.json"])
def test_flipped_byte_falls_back_to_the_previous_checkpoint(shared_runs: SharedRuns, reference: Path, tmp_path: Path, victim: str) -> None:
    stop_once(shared_runs, tmp_path, 13, "checkpoint.every_steps=5")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_10", "step_13", "step_5"]
    target = tmp_path / "checkpoints" / "step_13" / victim
    data = bytearray(target.read_bytes())
    # Inside a digest string of the manifest the flip still parses as JSON: its checksum must catch it.
    data[data.index(b'"hash"') + 12 if victim == "manifest.json" else len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, "checkpoint.every_steps=5")
    assert f"skipping checkpoint {tmp_path / 'checkpoints' / 'step_13'}: {victim} does not match" in attempts[0].stderr
    assert resumed_steps(attempts) == [10]
    assert_bitwise_equal(reference, tmp_path, STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_shards", "after_manifest", "before_publish"])
def test_sigkill_inside_a_checkpoint_write_leaves_the_previous_one(reference: Path, tmp_path: Path, point: str) -> None:
    killed = run_trainer(
        TINY_GPT, tmp_path, *FAST_GPT, "checkpoint.every_steps=4", "chaos.kill_in_checkpoint=12", f"chaos.kill_point={point}"
    )
    assert killed.returncode not in (0, 75)
    assert not (tmp_path / "checkpoints" / "step_12").exists()
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, "checkpoint.every_steps=4")
    assert resumed_steps(attempts) == [8]
    assert_bitwise_equal(reference, tmp_path, STEPS)


@pytest.mark.slow
def test_external_sigkill_at_a_random_moment_of_a_write(reference: Path, tmp_path: Path) -> None:
    """SIGKILL every rank as soon as a checkpoint write is seen in progress, after a random extra delay."""
    rnd = random.Random(os.getpid())
    # The reference's settings but a checkpoint every step: the steps the killed launch logged before the checkpoint
    # the resume starts from stay in the trajectory, so they must carry the same state hashes as the reference's
    # (hash_every_steps), wherever the kill lands.
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--set", f"run.dir={tmp_path}"]
    for item in (*FAST_GPT, "checkpoint.every_steps=1"):
        cmd += ["--set", item]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "checkpoints").glob(".tmp_step_*")) or not list((tmp_path / "checkpoints").glob("step_*")):
        assert time.monotonic() < deadline and launcher.poll() is None, "no checkpoint write seen"
        time.sleep(0.001)
    time.sleep(rnd.uniform(0, 0.01))
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT)
    assert len(resumed_steps(attempts)) == 1
    assert_bitwise_equal(reference, tmp_path, STEPS)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def assert_usage_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    message = proc.stderr.split("error: ", 1)[1]
    for word in words:
        assert word in message


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "train:\n  steps: 3\n  lr: [1,\n")
    assert_usage_error(run_trainer(bad, tmp_path / "run"), str(bad), "line 4")


def test_unknown_key_suggests_the_close_match(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "checkpoint:\n  every_step: 3\n")
    assert_usage_error(run_trainer(bad, tmp_path / "run"), "checkpoint.every_step", "Did you mean checkpoint.every_steps?", "keep_last")


def test_missing_config_file(tmp_path: Path) -> None:
    assert_usage_error(run_trainer(tmp_path / "nope.yaml", tmp_path / "run"), "does not exist")


def test_missing_entrypoint_module(tmp_path: Path) -> None:
    proc = run_trainer(TINY_GPT, tmp_path, "train.entrypoint=no_such_pkg.train:main")
    assert_usage_error(proc, "no_such_pkg.train", "PYTHONPATH")


@pytest.mark.slow
def test_checkpoint_from_another_world_size_is_refused_and_kept(shared_runs: SharedRuns, tmp_path: Path) -> None:
    stop_once(shared_runs, tmp_path, 4)
    before = (tmp_path / "checkpoints" / "step_4" / "manifest.json").read_bytes()
    proc = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, nproc=1)
    assert_usage_error(proc, "written by 2 ranks", "this run has 1")
    assert (tmp_path / "checkpoints" / "step_4" / "manifest.json").read_bytes() == before


@pytest.mark.slow
def test_checkpoint_from_another_torch_version_is_refused(shared_runs: SharedRuns, tmp_path: Path) -> None:
    stop_once(shared_runs, tmp_path, 4)
    path = tmp_path / "checkpoints" / "step_4" / "manifest.json"
    data = json.loads(path.read_text())
    data["torch_version"] = "1.13.1"
    data["manifest_sha256"] = manifest_checksum(data)  # as that torch's legato would have sealed it
    path.write_text(json.dumps(data))
    assert_usage_error(run_trainer(TINY_GPT, tmp_path, *FAST_GPT), "torch 1.13.1", "resume with the torch that wrote it")


@pytest.mark.slow
def test_run_dir_of_another_training_config_is_refused(shared_runs: SharedRuns, tmp_path: Path) -> None:
    stop_once(shared_runs, tmp_path, 4)
    proc = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, "train.lr=0.5")
    assert_usage_error(proc, "belongs to another training config", "train.lr")
    assert manifest(tmp_path, 4)["step"] == 4


@pytest.mark.slow
def test_no_verifiable_checkpoint_refuses_to_start_over(shared_runs: SharedRuns, tmp_path: Path) -> None:
    stop_once(shared_runs, tmp_path, 4)
    shard = tmp_path / "checkpoints" / "step_4" / "replay_rank0.pt"  # a stop checkpoint holds its replay base (step 0) only
    shard.write_bytes(shard.read_bytes()[:-10])
    proc = run_trainer(TINY_GPT, tmp_path, *FAST_GPT)
    assert_usage_error(proc, "None of the 1 checkpoints", "move the run directory away")
    assert "skipping checkpoint" in proc.stderr and "replay_rank0.pt does not match" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_4"]


@pytest.mark.slow
@pytest.mark.parametrize("pick", ["first", "verifying"])
def test_a_read_error_while_rank_0_picks_the_checkpoint_is_told_to_every_rank_and_harms_nothing(tmp_path: Path, pick: str) -> None:
    """Rank 0 picks the checkpoint to resume while the others wait for its pick (alone at first, by sizes; then, where
    the newest checkpoint's files do not verify, with the others hashing their shares of each candidate). A disk's read
    error there (planted: tests/helpers/stop_once.py READ_ERROR) ends rank 0 with the error, and each other rank with
    that cause rather than a lost connection (or a wait until a timeout, were rank 0's process to live on). Nothing
    saved is touched, and the run then resumes as it would have."""
    script = [sys.executable, str(ROOT / "tests" / "helpers" / "stop_once.py"), str(tmp_path)]
    assert codes(run_ranks(script, world_size=2, EVERY_STEPS="8")) == [0, 0]
    if pick == "verifying":  # the newest checkpoint's files no longer verify: the second pick verifies each candidate
        victim = tmp_path / "checkpoints" / "step_24" / "rank1.pt"
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    saved = {p: p.read_bytes() for p in (tmp_path / "checkpoints").glob("*/*")}
    failed = run_ranks(script, world_size=2, EVERY_STEPS="8", READ_ERROR=pick)
    assert codes(failed) == [1, 1]
    assert "OSError: [Errno 5] Input/output error (planted)" in failed[0].stderr
    told = "rank 0 failed while picking the checkpoint to resume (OSError: [Errno 5] Input/output error (planted))"
    assert told in failed[1].stderr and "Connection closed" not in failed[1].stderr, failed[1].stderr[-2000:]
    assert {p: p.read_bytes() for p in (tmp_path / "checkpoints").glob("*/*")} == saved
    again = run_ranks(script, world_size=2, EVERY_STEPS="8")
    resumed = "resumed at step 24" if pick == "first" else "resumed at step 16"
    assert codes(again) == [0, 0] and resumed in again[0].stderr and "verified" in again[0].stderr, again[0].stderr[-2000:]
