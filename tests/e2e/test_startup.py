"""A stop signal during start-up and a rank lost mid-run: requeue or resubmit, never a failed run.

Real processes and real signals: the task launcher's blocked signal mask, the
local launcher forwarding a signal while its ranks are still importing, the
submitit LocalExecutor under `legato run`, and a SIGKILL of one rank.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, run_trainer
from helpers.cli import ledger, legato, run_args, status, wait_for

from legato.slurm.startmask import launcher

SLOW_START = (
    "import signal, time\n"
    "time.sleep(1.5)  # the imports of a real task\n"
    "got = []\n"
    "signal.signal(signal.SIGUSR2, lambda *a: got.append(a[0]))\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})\n"
    "print('handled', got)\n"
)


@pytest.mark.parametrize("masked", [True, False])
def test_stop_signal_during_interpreter_start_waits_for_the_handler(masked: bool) -> None:
    python = shlex.split(launcher(["USR2"])) if masked else [sys.executable]
    proc = subprocess.Popen([*python, "-c", SLOW_START], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGUSR2)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if masked:
        assert proc.returncode == 0 and out.strip() == f"handled [{int(signal.SIGUSR2)}]"
    else:
        # Without the launcher the same signal kills the task before its handler exists: the fault is real.
        assert proc.returncode == -signal.SIGUSR2


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.slow
def test_signal_while_ranks_start_stops_at_the_restored_step_without_a_new_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = (*FAST_GPT, "train.steps=6", "train.num_workers=0")
    first = run_trainer(TINY_GPT, run_dir, *sets, "chaos.signal_at_steps=[2]")
    assert first.returncode == 75, first.stderr[-3000:]
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved == ["step_3"]

    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={run_dir}"]
    for item in sets:
        cmd += ["--set", item]
    launch = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        wait_for(lambda: len(children(launch.pid)) == 2, timeout=120, what="both ranks started")
        launch.send_signal(signal.SIGUSR2)  # forwarded to ranks that are still importing torch
        _, err = launch.communicate(timeout=300)
    finally:
        launch.kill()
    assert launch.returncode == 75, err[-3000:]
    assert "stop signal during start-up; stopping at step 3 without a new checkpoint" in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == saved

    last = run_trainer(TINY_GPT, run_dir, *sets)
    assert last.returncode == 0 and "resumed at step 3" in last.stderr, last.stderr[-3000:]


@pytest.mark.slow
def test_stop_signal_during_startup_under_legato_run_is_a_requeue(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = legato(
        *run_args(
            run_dir, "train.steps=6", "train.num_workers=0", "repro.enabled=false", "chaos.signal_rank=1", "chaos.signal_at_steps=[0]"
        )
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = status(run_dir)
    assert data["state"] == "finished" and data["resubmissions"] == 0
    first, second = data["attempts"]
    assert first["ended"] == "requeued" and first["stop_signal_step"] == 0 and first["last_step"] == 0
    assert second["resumed_from_step"] is None and second["ended"] == "finished"
    events = ledger(run_dir)
    assert not [e for e in events if e["event"] == "checkpoint_committed" and e["restart"] == 0]
    assert not [e for e in events if e["event"] == "failed"]
    assert [e["at_start"] for e in events if e["event"] == "stop_signal"] == [True]
    assert "stop signal reached rank 1 during start-up; the ranks stopped at step 0 without a new checkpoint" in proc.stdout


HANG_AT_EXIT = """
import atexit
import time
from pathlib import Path

from legato.loop import train

MARK = Path(__file__).with_name("hung_once")


def main(ctx):
    # Rank 0 of the first attempt never exits by itself (as a task stuck in a half-dead collective or an exit handler).
    if ctx.rank == 0 and not MARK.exists():
        MARK.touch()
        atexit.register(time.sleep, 3600)
    return train(ctx)
"""


@pytest.mark.slow
def test_a_dead_rank_after_a_checkpoint_is_resubmitted_and_resumed(tmp_path: Path) -> None:
    (tmp_path / "legato_hang_at_exit.py").write_text(HANG_AT_EXIT)
    run_dir = tmp_path / "run"
    args = run_args(
        run_dir, "train.steps=200", "checkpoint.every_steps=25", "repro.enabled=false", "train.entrypoint=legato_hang_at_exit:main"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(tmp_path))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "legato.orchestrator.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                run_dir.joinpath("ledger.jsonl").exists()
                and any(e["event"] == "checkpoint_committed" and e["step"] >= 25 for e in ledger(run_dir))
            ),
            timeout=300,
            what="a periodic checkpoint",
        )
        assert (tmp_path / "hung_once").exists()
        rank1 = next(e["pid"] for e in ledger(run_dir) if e["event"] == "rank_started" and e["rank"] == 1)
        os.kill(rank1, signal.SIGKILL)
        out, _ = supervisor.communicate(timeout=600)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, out[-3000:]
    lost = [e for e in ledger(run_dir) if e["event"] == "rank_lost"]
    assert len(lost) == 1 and "lost its peers" in lost[0]["reason"] and lost[0]["checkpoint_step"] % 25 == 0
    # Rank 0 hung on its way out: the supervisor cancelled the job after the grace period rather than wait forever.
    assert [e["job_id"] for e in ledger(run_dir) if e["event"] == "lost_rank_cancel"] == [lost[0]["job_id"]]
    assert "after it lost a rank; cancelled it" in out
    data = status(run_dir)
    first, second = data["attempts"]
    assert data["state"] == "finished" and data["resubmissions"] == 1
    assert "resubmitted" in first["ended"] and "lost its peers" in first["ended"]
    assert second["resumed_from_step"] == lost[0]["checkpoint_step"] and second["verified"] is True
