"""Ctrl-C on an attached `legato run` as a terminal sends it (SIGINT to the whole foreground process group), once or
twice in a row, or to the supervisor alone: exit 130 with no traceback on the terminal (submitit's local controller,
which the group's Ctrl-C reaches too, writes to the run's submitit/controllers.log instead), nothing of the local job
left running, and the same `legato run` then resumes the run, verified, to its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.cli import ledger, legato, run_args, status, wait_for


def attached(run_dir: Path, out: Path) -> subprocess.Popen:
    """`legato run` in a session of its own, as a terminal's foreground job is: its process group gets the Ctrl-C."""
    args = run_args(run_dir, "train.steps=100", "checkpoint.every_steps=10", "chaos.step_sleep_s=0.2")
    with (out / "stdout").open("w") as stdout, (out / "stderr").open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "legato.orchestrator.cli", *args],
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )


@pytest.mark.parametrize("target", ["group", "group twice", "supervisor"])
def test_ctrl_c_ends_an_attached_run_with_130_and_no_traceback(tmp_path: Path, target: str) -> None:
    run_dir = tmp_path / "run"
    supervisor = attached(run_dir, tmp_path)
    try:
        wait_for(
            lambda: (run_dir / "ledger.jsonl").is_file() and any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)),
            240,
            "a checkpoint",
        )
        if target == "supervisor":
            os.kill(supervisor.pid, signal.SIGINT)
        else:
            os.killpg(supervisor.pid, signal.SIGINT)
            if target == "group twice":
                time.sleep(0.2)
                os.killpg(supervisor.pid, signal.SIGINT)
        assert supervisor.wait(timeout=240) == 130
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    output = (tmp_path / "stdout").read_text() + (tmp_path / "stderr").read_text()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    wait_for(lambda: subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True).returncode != 0, 120, "the job's processes to end")
    if target != "group":
        return
    # The resume trains the rest at full speed: the sleep only kept the first attempt running until the Ctrl-C, and
    # neither it nor the checkpoint cadence is part of the training a run directory is checked against.
    resumed = legato(*run_args(run_dir, "train.steps=100", "checkpoint.every_steps=50"), timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(run_dir)["all_resumes_verified"]
