"""Ranks whose "replicated" state differs: a checkpoint that saved one copy for all of them never resumes as verified.

Real processes (2 ranks, gloo, tests/helpers/stop_once.py), asynchronous periodic checkpoints every 4 steps. An
asynchronous checkpoint and a replay base copy and hash only each rank's share; the other ranks' digests are completed
from it, which holds only while every rank holds the writer's values. Planted fault (DIVERGE=1): each rank scales its own
averaged gradients by 1 + rank / 8, so the ranks' parameters and optimizer state drift apart. Rank 0 writes the model and
its share of the optimizer state, rank 1 the rest of the optimizer state, so each rank holds tensors the other wrote.
Checked:

- the run's leader warns at each checkpoint (the other rank does not repeat it), the manifests name each rank's diverged
  tensors and their writer, the other rank, and the run's checkpoint_committed records name them too (what `legato
  status` and the supervisor show);
- with the final checkpoint gone, the resume from the last asynchronous one exits 3 on both ranks, naming rank 1's model
  and the recorded cause (and no guessed one), with replay off (the state itself is verified) and on (the replay base is),
  and harms no saved byte;
- the same run without the fault resumes verified from the same checkpoint, and its manifests name nothing;
- a synchronous stop checkpoint (SIGUSR2 to rank 1's pid) whose replay base, a share, diverged: the leader alone warns,
  and the resume is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import ROOT, manifest
from helpers.cli import ledger, wait_for
from helpers.launches import catches_usr2, reaped, start_ranks, stderr_tails, steps_done

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "stop_once.py"
ASYNC = {"ASYNC": "1", "EVERY_STEPS": "4", "KEEP_LAST": "100"}
CAUSE = "differed from the copy written for every rank"


def run(out: Path, **env: str) -> list[int]:
    with reaped(start_ranks(SCRIPT, out, 2, **env)) as procs:
        return [p.wait(timeout=300) for p in procs]


def saved(out: Path) -> dict[str, str]:
    root = out / "checkpoints"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def stderr(out: Path) -> str:
    return "\n".join((out / f"rank{rank}.stderr").read_text() for rank in range(2))


@pytest.mark.parametrize("replay_steps", ["0", "4"])
def test_a_rank_whose_replicated_copy_differed_fails_its_resume_naming_the_cause(tmp_path: Path, replay_steps: str) -> None:
    env = {**ASYNC, "DIVERGE": "1", "REPLAY_STEPS": replay_steps}
    assert run(tmp_path, **env) == [0, 0], stderr_tails(tmp_path)
    warned = (tmp_path / "rank0.stderr").read_text()
    assert "rank 1's copy of the replicated state differs from the copy written for every rank by rank 0" in warned
    assert "copy of the replicated state differs" not in (tmp_path / "rank1.stderr").read_text()  # the leader warns, once
    m = manifest(tmp_path, 20)
    assert [r["diverged"]["writers"] for r in m["ranks"]] == [[1], [0]]
    assert {t.split(":")[0] for t in m["ranks"][1]["diverged"]["tensors"]} == {"model", "optimizer"}
    assert {t.split(":")[0] for t in m["ranks"][0]["diverged"]["tensors"]} == {"optimizer"}
    committed = {e["step"]: e["diverged"] for e in ledger(tmp_path) if e["event"] == "checkpoint_committed"}
    assert committed[20] == {"0": m["ranks"][0]["diverged"]["tensors"], "1": m["ranks"][1]["diverged"]["tensors"]}
    shutil.rmtree(tmp_path / "checkpoints" / "step_24")
    before = saved(tmp_path)
    assert run(tmp_path, **env) == [3, 3], stderr_tails(tmp_path)
    err = (tmp_path / "rank0.stderr").read_text()
    assert "Resume verification failed" in err and "rank 1: model" in err and CAUSE in err, err[-3000:]
    assert (
        "rank 0: optimizer:0, optimizer:2, written by rank 1; rank 1: model:0, model:1, model:2, model:3, optimizer:1, optimizer:3, "
        "written by rank 0" in err
    ), err[-3000:]
    assert "Likely cause" not in err, err[-3000:]  # the replay's guess would name an unregistered generator first
    assert "resumed at step" not in stderr(tmp_path)  # what a verified resume says
    assert saved(tmp_path) == before


def test_the_same_run_without_the_fault_resumes_verified_from_the_same_checkpoint(tmp_path: Path) -> None:
    env = {**ASYNC, "REPLAY_STEPS": "0"}
    assert run(tmp_path, **env) == [0, 0], stderr_tails(tmp_path)
    assert all("diverged" not in r for r in manifest(tmp_path, 20)["ranks"])
    assert [e.get("diverged") for e in ledger(tmp_path) if e["event"] == "checkpoint_committed"] == [None] * 6
    shutil.rmtree(tmp_path / "checkpoints" / "step_24")
    assert run(tmp_path, **env) == [0, 0], stderr_tails(tmp_path)
    assert "resumed at step 20" in stderr(tmp_path) and "verified" in stderr(tmp_path) and "differs from the copy" not in stderr(tmp_path)


def test_a_synchronous_checkpoint_whose_replay_base_diverged_is_warned_of_once_and_refused(tmp_path: Path) -> None:
    env = {"DIVERGE": "1", "REPLAY_STEPS": "4"}  # no periodic checkpoints: the stop's replay base is a share, not a checkpoint
    with reaped(start_ranks(SCRIPT, tmp_path, 2, LEGATO_CHAOS_STEP_SLEEP_S="0.2", **env)) as procs:
        wait_for(lambda: all(catches_usr2(p.pid) for p in procs), 300, "the Session's stop handler")
        wait_for(lambda: steps_done(tmp_path) >= 6, 300, "six steps")
        os.kill(procs[1].pid, signal.SIGUSR2)
        assert [p.wait(timeout=300) for p in procs] == [75, 75], stderr_tails(tmp_path)
    assert "rank 1's copy of the replicated state differs" in (tmp_path / "rank0.stderr").read_text()
    assert "copy of the replicated state differs" not in (tmp_path / "rank1.stderr").read_text()
    m = manifest(tmp_path)
    assert "diverged" not in m["ranks"][1]  # a synchronous checkpoint hashes each rank's own state
    assert m["replay"]["ranks"][1]["diverged"]["writers"] == [0]
    before = saved(tmp_path)
    assert run(tmp_path, **env) == [3, 3], stderr_tails(tmp_path)
    err = (tmp_path / "rank0.stderr").read_text()
    assert "Resume verification failed" in err and CAUSE in err and "Likely cause" not in err, err[-3000:]
    assert saved(tmp_path) == before
