"""No orphans: a SIGKILL of the local launcher, of one rank or of the supervisor, at a random moment, leaves no
process of the run behind; a detached supervisor ends when its run ends. Thirty launcher kills in a row leave
nothing running even a second later (before the ranks armed their parent-death signal before exec, a kill during a
rank's start-up left it running for seconds); a process that has its SIGKILL pending but still sits in a system call
(an fsync on a loaded machine's disk) counts as ended once it is gone, however long that takes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_GPT
from helpers.cli import ledger, legato, run_args

from legato.store.trajectory import read_trajectory


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone: it holds nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def dying(pid: int) -> bool:
    """SIGKILL is pending: the process runs none of its own code again. It ends as soon as the system call it sits
    in returns (an fsync on a disk a loaded machine keeps busy can take seconds)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return True
    pending = (int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:")))
    return any(mask & (1 << (signal.SIGKILL - 1)) for mask in pending)


def described(pid: int) -> str:
    """`pid`, its state letter and the kernel function it waits in, for a failure message."""
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return f"{pid} ({state}, {Path(f'/proc/{pid}/wchan').read_text() or 'running'})"
    return f"{pid} (gone)"


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_launcher(run_dir: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "legato",
        str(TINY_GPT),
        "--nproc",
        "2",
        "--set",
        f"run.dir={run_dir}",
        "--set",
        "train.steps=1000000",
        "--set",
        "train.num_workers=2",
        "--set",
        "chaos.signal_at_steps=[]",
        "--set",
        "checkpoint.every_steps=0",
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONWARNINGS="ignore")
    )


def wait_for_six(launcher: subprocess.Popen, run_dir: Path, seen: set[int]) -> None:
    """Two ranks and two DataLoader workers each: the run's six processes, all training."""

    def all_up() -> bool:
        seen.update(descendants(launcher.pid))
        return len([p for p in descendants(launcher.pid) if alive(p)]) >= 6 and (run_dir / "trajectory").is_dir()

    wait_until(all_up, 180, "the ranks and their workers")
    time.sleep(random.uniform(0, 2))  # a random moment of training
    seen.update(descendants(launcher.pid))


def wait_all_gone(seen: set[int], timeout: float = 60) -> None:
    wait_until(lambda: not any(alive(p) for p in seen), timeout, f"every process of the run to end: {sorted(p for p in seen if alive(p))}")


def kill_leftovers(seen: set[int]) -> None:
    for pid in seen:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("victim", ["launcher", "rank"])
def test_sigkill_of_the_launcher_or_a_rank_leaves_no_process_behind(tmp_path: Path, victim: str) -> None:
    launcher = start_launcher(tmp_path / "run")
    seen: set[int] = set()
    try:
        wait_for_six(launcher, tmp_path / "run", seen)
        if victim == "launcher":
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(timeout=30)
        else:
            os.kill(children(launcher.pid)[1], signal.SIGKILL)
            assert launcher.wait(timeout=120) not in (0, 75)  # the launcher ends the other rank and reports a failure
        wait_all_gone(seen)
        assert len(seen) >= 6
    finally:
        launcher.kill()
        launcher.wait()
        kill_leftovers(seen)


def run_pids(run_dir: Path) -> set[int]:
    """The local job's controller and its ranks, as the ledger names them."""
    events = ledger(run_dir)
    return {int(e["job_id"]) for e in events if e["event"] in ("submitted", "resubmitted")} | {
        e["pid"] for e in events if e["event"] == "rank_started"
    }


def detach(run_dir: Path, *sets: str) -> int:
    proc = legato(*run_args(run_dir, *sets), "--detach")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(re.search(r"supervisor pid (\d+)", proc.stdout).group(1))


def test_sigkill_of_the_supervisor_then_a_detached_one_ends_with_its_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ("train.steps=150", "train.num_workers=2", "repro.enabled=false")
    first = detach(run_dir, *sets)
    seen = {first}
    try:
        wait_until(lambda: len([e for e in ledger(run_dir) if e["event"] == "rank_started"]) == 2, 180, "both ranks")
        time.sleep(random.uniform(0, 2))
        seen |= descendants(first) | run_pids(run_dir)
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not alive(first), 30, "the killed supervisor to go")

        # The job carries on alone; a new detached supervisor takes the run over and ends with it.
        second = detach(run_dir, *sets)
        seen.add(second)
        wait_until(lambda: any(e["event"] == "finished" for e in ledger(run_dir)), 400, "the run to finish")
        seen |= run_pids(run_dir)
        wait_all_gone(seen)
    finally:
        kill_leftovers(seen)


def full_tree(controller: int, run_dir: Path) -> set[int]:
    """The controller and every process of its job, read once its task, the two ranks the task forked and their two
    DataLoader workers each are all alive: between two epochs a rank's workers are gone, and a tree read then would
    miss them."""
    tree: set[int] = set()

    def all_up() -> bool:
        tree.clear()
        tree.update(descendants(controller))
        return len([p for p in tree if alive(p)]) >= 7

    wait_until(all_up, 120, "the controller's task, its two ranks and their four workers")
    return tree | run_pids(run_dir)


def test_sigkill_of_the_local_job_controller_takes_its_ranks_and_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Far more steps than the test waits for: ranks that outlived their controller would still be training.
    args = run_args(run_dir, "train.steps=100000", "checkpoint.every_steps=25", "train.num_workers=2", "repro.enabled=false")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "legato.orchestrator.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    seen: set[int] = set()
    try:
        wait_until(
            lambda: (run_dir / "ledger.jsonl").exists() and any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)),
            180,
            "a periodic checkpoint",
        )
        controller = int(next(e["job_id"] for e in ledger(run_dir) if e["event"] == "submitted"))
        seen = full_tree(controller, run_dir)
        os.kill(controller, signal.SIGKILL)
        wait_all_gone(seen)
        assert len(seen) >= 8  # the controller, its task, two ranks, two workers each
        # The supervisor resubmits, and the new job resumes verified from the newest checkpoint.
        wait_until(lambda: any(e["event"] == "resumed" for e in ledger(run_dir)), 180, "the resubmitted job's resume")
        assert legato("cancel", str(run_dir)).returncode == 0
        out, _ = supervisor.communicate(timeout=120)
    finally:
        supervisor.kill()
        kill_leftovers(seen)
    events = ledger(run_dir)
    assert [e["previous_job_id"] for e in events if e["event"] == "resubmitted"] == [str(controller)], out[-3000:]
    assert [e["match"] for e in events if e["event"] == "resumed"] == [True]


MARK = "LEGATO_TEST_RUN_MARK"
CAMPAIGN = (
    "train.steps=100000",
    "train.options.sentences=100",
    "train.num_workers=1",
    "checkpoint.every_steps=5",
    "checkpoint.keep_last=1000",
    "checkpoint.hash_every_steps=5",
    "checkpoint.agree_every_steps=1",
    "checkpoint.replay_steps=4",
    "checkpoint.replay_cost=0",
    "chaos.signal_at_steps=[]",
)
MOMENTS = ["start-up"] * 10 + ["training"] * 10 + ["checkpoint"] * 10


def marked(token: str) -> set[int]:
    """Every live process whose environment carries `token`: the launcher, its ranks and their DataLoader workers."""
    needle = f"{MARK}={token}\0".encode()
    found = set()
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.add(int(entry.name))
    return found


def launch_marked(run_dir: Path, token: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={run_dir}"]
    for item in CAMPAIGN:
        cmd += ["--set", item]
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore", **{MARK: token}),
        )


def wait_for_moment(moment: str, launcher: subprocess.Popen, token: str, run_dir: Path, since: float, rnd: random.Random) -> None:
    """Sleep until a random moment of the ranks' start-up (importing torch, meeting, resuming), of training, or inside
    a checkpoint write."""
    if moment == "start-up":
        wait_until(lambda: launcher.poll() is not None or len(marked(token)) >= 3, 240, "the launcher to start its ranks")
        time.sleep(rnd.uniform(0, 2))
        return
    traj = run_dir / "trajectory" / "rank0.jsonl"
    resumed_from = newest_step(run_dir)
    wait_until(lambda: launcher.poll() is not None or trained_past(traj, resumed_from, since), 240, "training to start")
    if moment == "training":
        time.sleep(rnd.uniform(0, 1))
        return
    # A write of this launch: a temporary directory an earlier kill left stays until the next commit prunes it.
    deadline = time.monotonic() + 120
    while not [p for p in (run_dir / "checkpoints").glob(".tmp_step_*") if _mtime(p) > since]:
        assert time.monotonic() < deadline and launcher.poll() is None, "no checkpoint write seen"
        time.sleep(0.001)
    time.sleep(rnd.uniform(0, 0.02))


def committed_steps(run_dir: Path) -> list[int]:
    """The steps of the run's committed checkpoints, oldest first."""
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*"))


def newest_step(run_dir: Path) -> int:
    """The step of the newest committed checkpoint, 0 without one."""
    return max(committed_steps(run_dir), default=0)


def trained_past(traj: Path, step: int, since: float) -> bool:
    """This launch's rank 0 logged a step after `step`: it trains. Its trajectory is rewritten (cut back to the
    resumed step) when the Session opens, so a fresh mtime alone would also be true before the first batch."""
    if _mtime(traj) <= since:
        return False
    records = read_trajectory(traj)
    return bool(records) and records[-1]["step"] > step


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # committed or pruned meanwhile
        return 0.0


def kill_and_look(launcher: subprocess.Popen, token: str) -> tuple[int, set[int]]:
    """SIGKILL the launcher by pid from outside; how many processes of the run lived just before, and which of them
    are still alive without a SIGKILL pending 1 s after none of them has one (those that have one are waited for until
    they are gone). Each death reaches the next process down only once that one's parent is gone (launcher, rank,
    DataLoader worker): on a machine loaded with busy loops a dying rank took over a second to end, and its worker's
    parent-death signal came only then."""
    before = marked(token)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 120
    time.sleep(1)
    left = marked(token)
    while any(dying(pid) for pid in left):
        assert time.monotonic() < deadline, f"the processes with SIGKILL pending to end: {[described(p) for p in left]}"
        time.sleep(1)
        left = marked(token)
    return len(before), left


LAUNCHER_WITH_A_CHILD = """
import ctypes, signal, subprocess, sys, time
PR_SET_PDEATHSIG = 1
# The child dies with this process, as a rank armed with its parent-death signal dies with the launcher.
subprocess.Popen(sys.argv[1:], preexec_fn=lambda: ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
time.sleep(600)
"""


def test_the_kill_check_names_a_process_that_outlives_the_launcher_and_not_one_that_ends_with_it(tmp_path: Path) -> None:
    """The planted fault for `kill_and_look`: a process of the run in a session of its own, which the launcher's death
    does not reach, is reported running a second later; the launcher's own child, ended with it, is not."""
    token = f"planted-{os.getpid()}"
    env = dict(os.environ, **{MARK: token})
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_WITH_A_CHILD, *sleeper], env=env)
    stray = subprocess.Popen(sleeper, env=env, start_new_session=True)
    try:
        wait_until(lambda: len(marked(token)) == 3, 60, "the launcher, its child and the stray process")
        assert not dying(stray.pid)
        count, running = kill_and_look(launcher, token)
        assert (count, running) == (3, {stray.pid})
    finally:
        for pid in marked(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stray.wait(timeout=60)


def stacks_of_the_run(token: str, log: Path) -> str:
    """The state and kernel wait of every process of a launch that stopped making progress, then every thread's stack:
    SIGABRT, which PYTHONFAULTHANDLER (tests/conftest.py sets it for every process) turns into a dump on the launch's log."""
    pids = sorted(marked(token))
    states = ", ".join(described(pid) for pid in pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not marked(token), 30, "the aborted processes to end")
    return f"processes of the launch: {states}\n{log.read_text()[-12000:]}"


def commit_a_first_checkpoint(run_dir: Path, token: str, log: Path) -> None:
    """One launch trained until its first checkpoint commits, then killed: without it, a seed whose early kills all
    land before the first commit (start-up, the first batches, the first write) leaves no launch anything to resume."""
    launcher = launch_marked(run_dir, token, log)
    wait_until(lambda: launcher.poll() is not None or newest_step(run_dir) > 0, 240, "the first checkpoint")
    assert launcher.poll() is None, log.read_text()[-3000:]
    _, left = kill_and_look(launcher, token)
    assert left == set(), f"first launch: {[described(p) for p in sorted(left)]} still running 1 s after"


@pytest.mark.slow
def test_thirty_launcher_sigkills_at_random_moments_leave_nothing_alive_a_second_later(tmp_path: Path) -> None:
    """Start-up, training and checkpoint writes, ten kills each, in a seeded order and at seeded delays (the seed is
    in every failure message; LEGATO_KILL_SEED replays one), after a first launch that commits one checkpoint; each
    launch resumes the run the previous kill left. Every resume still verifies, and the run's checkpoints are bit for
    bit those of an uninterrupted run."""
    seed = int(os.environ.get("LEGATO_KILL_SEED", "0")) or random.randrange(1, 10**6)
    rnd = random.Random(seed)
    moments = rnd.sample(MOMENTS, len(MOMENTS))
    run_dir, token = tmp_path / "run", f"orphans-{os.getpid()}-{seed}"
    busy: list[int] = []
    must_resume = 0  # kills inside a write of a launch that found a checkpoint: its resume had finished
    try:
        commit_a_first_checkpoint(run_dir, token, tmp_path / "first.log")
        for i, moment in enumerate(moments):
            since = time.time()
            must_resume += moment == "checkpoint" and newest_step(run_dir) > 0
            launcher = launch_marked(run_dir, token, tmp_path / f"launch{i}.log")
            try:
                wait_for_moment(moment, launcher, token, run_dir, since, rnd)
            except AssertionError as exc:
                exc.add_note(f"seed {seed}, launch {i} ({moment}):\n{stacks_of_the_run(token, tmp_path / f'launch{i}.log')}")
                raise
            assert launcher.poll() is None, (tmp_path / f"launch{i}.log").read_text()[-3000:]
            count, left = kill_and_look(launcher, token)
            shown = [described(p) for p in sorted(left)]
            assert left == set(), f"seed {seed}, kill {i} ({moment}): {shown} of {count} processes still running 1 s after"
            busy.append(count)
        # Two ranks with a DataLoader worker each under the launcher: the kills hit runs in full flight.
        assert sum(1 for c in busy if c >= 5) >= 15, busy
        logs = "\n".join((tmp_path / f"launch{i}.log").read_text() for i in range(len(moments)))
        resumes = [line for line in logs.splitlines() if "resumed at step" in line]
        assert len(resumes) >= must_resume >= 3, f"seed {seed}: {len(resumes)} resumes, {must_resume} kills after one: {resumes}"
        assert all("verified" in line for line in resumes), resumes
        reference = tmp_path / "reference"
        steps = committed_steps(run_dir)
        launcher = launch_marked(reference, token, tmp_path / "reference.log")
        wait_until(lambda: (reference / "checkpoints" / f"step_{steps[-1]}").is_dir(), 600, f"the reference's step {steps[-1]}")
        _, left = kill_and_look(launcher, token)
        assert left == set()
        for step in steps:
            ours = json.loads((run_dir / "checkpoints" / f"step_{step}" / "manifest.json").read_text())["global_hash"]
            theirs = json.loads((reference / "checkpoints" / f"step_{step}" / "manifest.json").read_text())["global_hash"]
            assert ours == theirs, f"seed {seed}: step {step} differs from the uninterrupted run"
    finally:
        for pid in marked(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
