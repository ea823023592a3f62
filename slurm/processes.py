"""Small process helpers shared by the SLURM glue: run a command with a timeout, check and signal a pid.

A command that is missing, fails or times out yields None, never an exception:
callers decide what an unanswered scheduler means. Commands are argument
lists, never shell strings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 20


def output(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str | None:
    """The command's stripped stdout when it exits 0 within the timeout, else None."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("%s: %s", cmd[0], exc)
        return None
    if proc.returncode != 0:
        log.debug("%s exited %d: %s", " ".join(cmd), proc.returncode, proc.stderr.strip())
        return None
    return proc.stdout.strip()


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone; our own dead children are reaped first)."""
    reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
