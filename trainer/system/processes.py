"""Process helpers for every package: run a command with a hard timeout, check and signal a pid.

A command that is missing, fails or times out yields a result that says so,
never an exception: callers decide what an unanswered command means. On a
timeout the command's whole process group is killed, so a child that keeps
the output pipe open cannot hold the caller past the limit. Commands are
argument lists, never shell strings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 20


@dataclass(frozen=True)
class CommandResult:
    """How one command ended: whether it succeeded, its output or why it failed, and how long it took."""

    ok: bool
    output: str | None  # stdout when the command exited 0
    error: str | None  # why it did not, in a few words
    seconds: float


def run_command(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
    """Run `cmd` with stdin closed and a hard time limit."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True
        )
    except OSError as exc:
        return CommandResult(False, None, f"{cmd[0]}: {exc.strerror or exc}", 0.0)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return CommandResult(False, None, f"timed out after {timeout:g}s", round(time.monotonic() - started, 3))
    seconds = round(time.monotonic() - started, 3)
    if proc.returncode != 0:
        return CommandResult(False, None, f"exit code {proc.returncode}: {err.strip()[-300:]}", seconds)
    return CommandResult(True, out, None, seconds)


def output(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str | None:
    """The command's stripped stdout when it exits 0 within the timeout, else None."""
    result = run_command(cmd, timeout)
    if not result.ok:
        log.debug("%s: %s", " ".join(cmd), result.error)
        return None
    return (result.output or "").strip()


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone; our own dead children are reaped first)."""
    reap(pid)
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid`, or None when it is gone (read from /proc)."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


def children(parent: int) -> list[int]:
    """The live processes whose parent is `parent` (read from /proc; empty where there is none)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(entry.name))
        if fields is not None and int(fields[1]) == parent and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None when `pid` is gone; a thread's id
    reads its own."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def started_at(pid: int) -> float | None:
    """When process `pid` started, as a Unix time, to a clock tick: now, less the time since boot (/proc/uptime) past its
    start after boot (its stat's clock ticks); the boot time /proc/stat gives is whole seconds. None when it is gone or
    /proc does not say."""
    fields = stat_fields(pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")) if fields is not None else None
    except (OSError, ValueError, IndexError):
        return None


def launch_times(environ: Mapping[str, str], pid: int | None = None) -> dict[str, float]:
    """What an `ATTEMPT_STARTED` record carries of its time, where known: the start of process `pid` (`launched_at`;
    this process when None: a rank forked warm names the one it was forked from) and, under SLURM, when the job ends
    (`ends_at`, from SLURM_JOB_END_TIME)."""
    times: dict[str, float] = {}
    launched = started_at(os.getpid() if pid is None else pid)
    if launched is not None:
        times["launched_at"] = round(launched, 3)
    with contextlib.suppress(ValueError):
        ends = float(environ.get("SLURM_JOB_END_TIME", ""))
        if ends > 0:
            times["ends_at"] = ends
    return times


def reap(pid: int) -> None:
    """Collect the exit status of the child `pid` if it has exited, without waiting."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def kill(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to `pid`; a process already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
