"""Hangs nobody announces, planted from outside as the world sends them, found by the watchdog and resumed bitwise.

A DDP-tutorial loop with a 2-worker DataLoader (tests/helpers/hang_loop.py), 2 ranks, gloo, the watchdog's bound
shortened through LEGATO_HANG (a floor of 5 quiet seconds, 30 in a checkpoint): a rank SIGSTOPped mid-step (its peer
then waits in a collective for a rank that stopped participating), a DataLoader worker SIGSTOPped under `python -m
legato.torchrun`, a deadlock in the user's own code, a rank SIGSTOPped while the ranks write a checkpoint, and a
rank 0 that computes alone while the other waits (activity, not a hang: the planted fault the watchdog must not take
for one). Each hung attempt ends with exit 124, every process's stacks in RUN/hangs/<job>/<attempt>/ naming the
stuck frame, one `hang` record, and no process left; the next launch resumes it verified, and the run ends on the
bits of the uninterrupted run. The same hang again in the next attempt ends the run (exit 1, FAILED naming it)
instead of a loop for ever. Under `legato run` the supervisor resubmits the hung job. After a SIGKILL between
checkpoints, the steps the killed attempt logged past its newest checkpoint are counted, for that attempt, in a
`work_lost` record and in `legato status`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gpt_reference, manifest
from helpers.cli import ledger, run_args, status, wait_for
from helpers.launches import ROOT, process_tree, reaped, start_ranks, stderr_tails, steps_done
from helpers.shared_runs import SharedRuns

from legato.runtime.launch import free_port
from legato.system.processes import alive

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "hang_loop.py"
HANG = {"LEGATO_HANG": "floor_s=5,phase_s=30"}
WAIT_S = 240  # a rank's whole attempt, on a loaded machine


def final_hash(run: Path) -> str:
    finished = [e for e in ledger(run) if e["event"] == "finished"]
    assert finished, [e["event"] for e in ledger(run)]
    return finished[-1]["final_global_hash"]


def launch(run: Path, **env: str) -> list[int]:
    """One attempt of the two ranks to its end; their exit codes."""
    with reaped(start_ranks(SCRIPT, run, 2, **HANG, **env)) as procs:
        return [p.wait(timeout=WAIT_S) for p in procs]


def hang_record(run: Path) -> dict:
    hangs = [e for e in ledger(run) if e["event"] == "hang"]
    assert len(hangs) == 1, hangs
    return hangs[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    run = tmp_path_factory.mktemp("hangs") / "reference"
    codes = launch(run)
    assert codes == [0, 0], stderr_tails(run)
    return final_hash(run)


def test_a_rank_stopped_from_outside_is_found_its_stacks_written_and_the_run_resumes_bitwise(tmp_path: Path, reference: str) -> None:
    run = tmp_path / "run"
    with reaped(start_ranks(SCRIPT, run, 2, **HANG)) as procs:
        wait_for(lambda: steps_done(run) >= 6, timeout=WAIT_S, what="rank 0's sixth step")
        workers = process_tree(procs[0].pid) + process_tree(procs[1].pid)
        os.kill(procs[1].pid, signal.SIGSTOP)
        codes = [p.wait(timeout=WAIT_S) for p in procs]
    # Rank 1, continued to answer for its stacks, ends by the watchdog (its own or rank 0's SIGKILL) or on its lost peer.
    assert codes[0] == 124 and codes[1] in (124, 1, -signal.SIGKILL), (codes, stderr_tails(run))
    wait_for(lambda: not any(alive(pid) for pid in workers), timeout=60, what="the DataLoader workers to end")

    record = hang_record(run)
    assert record["stopped"] == ["rank 1"] and not record["repeated"], record
    folder = run / record["stacks"]
    assert folder == run / "hangs" / "script" / "1", record
    assert "hang_loop.py" in (folder / "rank1.txt").read_text()  # where it was stopped, in the script's loop
    # Rank 0 waited for it inside torch (a gradient all-reduce in backward, or a checkpoint's barrier), from the loop.
    waited = (folder / "rank0.txt").read_text()
    assert "site-packages/torch/" in waited and "hang_loop.py" in waited, waited
    assert len(list(folder.glob("rank*-worker*.txt"))) == 4, sorted(os.listdir(folder))
    assert "hung at step" in status(run)["attempts"][0]["ended"]

    assert launch(run) == [0, 0], stderr_tails(run)
    resumed = [e for e in ledger(run) if e["event"] == "resumed"]
    assert [e["match"] for e in resumed] == [True], resumed
    assert final_hash(run) == reference


def test_a_rank_stopped_while_the_ranks_write_a_checkpoint_is_found_and_the_run_resumes_from_the_one_before(
    tmp_path: Path,
) -> None:
    """64 MiB of state per rank, so that a checkpoint's write is long enough to be caught in the act: rank 1 is
    SIGSTOPped as soon as the checkpoint of step 8 has its temporary directory (rank 0 creates it before any rank
    writes). Rank 0 then waits in the checkpoint's collectives: the hang is found under the checkpoint phase's bound
    (30 s here) and the stacks show rank 0 inside the checkpoint's write. Continued to answer for its stacks, rank 1
    may complete the checkpoint's collectives before the watchdog ends it: step 8 is then published whole, else not at
    all. The next launch resumes from the newest published checkpoint, verified, and ends on the bits of the
    uninterrupted run."""
    ballast = {"BALLAST_MB": "64", "STEPS": "16"}
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert launch(reference, **ballast) == [0, 0], stderr_tails(reference)
    writing = run / "checkpoints" / ".tmp_step_8"
    with reaped(start_ranks(SCRIPT, run, 2, **HANG, **ballast)) as procs:
        deadline = time.monotonic() + WAIT_S
        while not writing.exists():  # looked at every 5 ms: the stop must land while the ranks write
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), stderr_tails(run)
            time.sleep(0.005)
        os.kill(procs[1].pid, signal.SIGSTOP)
        codes = [p.wait(timeout=WAIT_S) for p in procs]
    # Rank 1 ends by the watchdog or its lost peer, as mid-step; or, continued mid-write to answer for its stacks while
    # its threads run, it crashed answering (SIGSEGV, once in a whole suite's run): it was being ended either way.
    assert codes[0] == 124 and codes[1] in (124, 1, -signal.SIGKILL, -signal.SIGSEGV), (codes, stderr_tails(run))

    record = hang_record(run)
    assert record["phase"] == "checkpoint" and record["bound_s"] == 30 and record["stopped"] == ["rank 1"], record
    waited = (run / record["stacks"] / "rank0.txt").read_text()
    assert "legato/store/checkpoint.py" in waited and "hang_loop.py" in waited, waited
    newest = 8 if (run / "checkpoints" / "step_8" / "manifest.json").exists() else 4

    assert launch(run, **ballast) == [0, 0], stderr_tails(run)
    resumed = [e for e in ledger(run) if e["event"] == "resumed"]
    assert [(e["step"], e["match"]) for e in resumed] == [(newest, True)], resumed
    assert final_hash(run) == final_hash(reference)


def test_a_stopped_dataloader_worker_under_legato_torchrun_ends_the_attempt_and_the_next_launch_resumes(
    tmp_path: Path, reference: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, **HANG, PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))

    def cmd() -> list[str]:
        return [sys.executable, "-m", "legato.torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()), str(SCRIPT), str(run)]

    with (run / "launcher.err").open("w") as err:
        launcher = subprocess.Popen(cmd(), env=env, stderr=err, stdout=subprocess.DEVNULL)
        with reaped([launcher]):
            wait_for(lambda: steps_done(run) >= 6, timeout=WAIT_S, what="rank 0's sixth step")
            ranks = sorted(process_tree(launcher.pid))
            worker = next(pid for pid in ranks if any(pid in process_tree(rank) for rank in ranks))
            os.kill(worker, signal.SIGSTOP)
            assert launcher.wait(timeout=WAIT_S) == 124, (run / "launcher.err").read_text()[-3000:]
    assert "hang watchdog ended them" in (run / "launcher.err").read_text()
    record = hang_record(run)
    assert any(name.split()[-2:] == ["worker", str(worker)] for name in record["stopped"]), record
    wait_for(lambda: not alive(worker), timeout=60, what="the stopped worker to end")

    again = subprocess.run(cmd(), env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert again.returncode == 0, again.stderr[-3000:]
    assert final_hash(run) == reference


def test_a_deadlock_in_user_code_is_named_by_its_line_and_the_same_hang_again_ends_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    codes = launch(run, DEADLOCK_AT="7", DEADLOCK_ATTEMPTS="9")
    # Rank 1 waits for rank 0 in a collective: it finds the hang too, or loses its peer when rank 0 exits first.
    assert codes[0] == 124 and codes[1] in (124, 1), (codes, stderr_tails(run))
    record = hang_record(run)
    assert (record["rank"], record["step"]) == (0, 7), record
    assert record["user_frame"].endswith("in user_code_that_deadlocks") and record["frame"] == record["user_frame"], record
    assert "user_code_that_deadlocks" in (run / record["stacks"] / "rank0.txt").read_text()

    assert launch(run, DEADLOCK_AT="7", DEADLOCK_ATTEMPTS="9") == [1, 1], stderr_tails(run)  # 1 either way: not retried
    second = [e for e in ledger(run) if e["event"] == "hang"][-1]
    assert second["repeated"] and second["stacks"] == "hangs/script/2", second
    summary = status(run)
    assert summary["state"] == "failed" and "exactly where an earlier attempt hung" in summary["failure"], summary


def test_rank_0_computing_alone_while_the_other_waits_is_not_a_hang(tmp_path: Path, reference: str) -> None:
    run = tmp_path / "run"
    assert launch(run, VALIDATE_AT="5", VALIDATE_S="15") == [0, 0], stderr_tails(run)  # three floors of a waiting rank 1
    assert not [e for e in ledger(run) if e["event"] == "hang"]
    assert not (run / "hangs").exists()
    assert (run / ".activity" / "script.1").is_file()  # rank 0 said it was busy; rank 1 read it
    assert final_hash(run) == reference


def test_legato_run_resubmits_a_hung_job_and_the_run_ends_verified_on_the_uninterrupted_bits(
    shared_runs: SharedRuns, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    training = ("train.steps=200", "checkpoint.every_steps=25")
    sets = (*training, "hang.floor_s=5", "hang.phase_s=30")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "legato.orchestrator.cli", *run_args(run_dir, *sets)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: run_dir.joinpath("ledger.jsonl").exists() and any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)),
            timeout=WAIT_S,
            what="a periodic checkpoint",
        )
        rank1 = next(e["pid"] for e in ledger(run_dir) if e["event"] == "rank_started" and e["rank"] == 1)
        os.kill(rank1, signal.SIGSTOP)
        out, _ = supervisor.communicate(timeout=600)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, out[-3000:]
    assert "hung at step" in out and "resubmitted as job" in out, out[-3000:]
    record = hang_record(run_dir)
    assert "rank 1" in record["stopped"], record

    data = status(run_dir)
    first, second = data["attempts"]
    assert first["ended"].startswith("hung at step"), first
    assert second["verified"] is True and data["resubmissions"] == 1
    # The uninterrupted run of the same training (the hang settings do not change its bits), shared with test_supervisor.
    assert data["final_global_hash"] == manifest(gpt_reference(shared_runs, *training))["global_hash"]


def test_the_steps_a_sigkill_lost_are_counted_for_the_attempt_that_trained_them(tmp_path: Path, reference: str) -> None:
    run = tmp_path / "run"
    with reaped(start_ranks(SCRIPT, run, 2, **HANG)) as procs:
        wait_for(lambda: steps_done(run) >= 10, timeout=WAIT_S, what="rank 0's tenth step")
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        assert [p.wait(timeout=60) for p in procs] == [-signal.SIGKILL] * 2
    logged = [json.loads(line)["step"] for line in (run / "trajectory" / "rank0.jsonl").read_text().splitlines()]
    newest = max(int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*"))
    assert logged[-1] > newest, (logged, newest)  # the kill came between checkpoints (every 4 steps, 0.1 s apart)

    assert launch(run) == [0, 0], stderr_tails(run)
    (lost,) = [e for e in ledger(run) if e["event"] == "work_lost"]
    assert (lost["step"], lost["trained_to"], lost["lost_steps"]) == (newest, logged[-1], logged[-1] - newest), lost
    summary = status(run)
    assert [a["lost_steps"] for a in summary["attempts"]] == [logged[-1] - newest, 0] and summary["lost_steps"] == logged[-1] - newest
    assert final_hash(run) == reference
