"""Helpers to drive the real `legato` CLI in a subprocess and read what a run wrote; shared by the e2e and
cluster layers (and the unit tests that only check a CLI refusal). Nothing here starts a run by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import FAST_GPT, ROOT, TINY_GPT


def legato(*args: str, timeout: float = 300, **environ: str) -> subprocess.CompletedProcess:
    """Run `legato ARGS...` as a user would, with its output captured (and `environ` added to its environment)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **environ)
    return subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def run_args(run_dir: Path, *sets: str) -> list[str]:
    args = ["run", str(TINY_GPT), "--set", f"run.dir={run_dir}"]
    for item in (*FAST_GPT, *sets):
        args += ["--set", item]
    return args


def status(run_dir: Path) -> dict:
    proc = legato("status", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


def wait_for(predicate, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def assert_usage_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, no traceback, one line starting `error: ` holding every needle."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip()
    assert message.startswith("error: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message
