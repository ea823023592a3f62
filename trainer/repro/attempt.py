"""One attempt's environment capture on one node, recorded in the run's ledger: `legato run`'s job side calls
`capture_and_record` in its own process; a script's own Session starts `start_for_script`, a short process of its own.

A Session does not wait for its capture to start training: the capture runs `git`, `nvidia-smi` and `module` with
timeouts and reads every installed distribution, work a rank must not do between its start and its first step, and a
thread for it would be one more thread that starts and ends while the script's DataLoader may fork its workers. The
process dies with its rank (a parent-death signal) and is ended with the loop (`end_for_script`: a short wait, then
killed), so no launch leaves it behind. It writes only under the run directory (`RUN/repro/JOB/ATTEMPT[/nodeN]` and
the ledger) and never reads a checkpoint. A failed capture is recorded (`repro_failed`), never raised: it must never
stop training.

    python -m legato.repro.attempt RANK_PID RUN_DIR JOB_ID RESTART NODE [ARGV...] < STACK   (what `start_for_script` runs)
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from legato.config import ReproSection
from legato.events import SCRIPT_EXECUTOR, Kind
from legato.ledger_file import append_record, new_record
from legato.paths import RunPaths
from legato.repro.capture import CaptureRequest, capture, stack_text
from legato.repro.redact import Redactor, run_key
from legato.system.lifeline import die_with_parent

log = logging.getLogger(__name__)

# How long the loop's end waits for a capture still running (one takes 0.3 s of CPU, so only an attempt that ends
# within seconds of its start meets one) before it kills it: a stop at the time limit must not wait longer.
END_WAIT_S = 5.0

# Records one ledger event of the given kind with these fields (the caller adds its job tag and redaction).
Append = Callable[..., Any]


def capture_and_record(request: CaptureRequest, node: int, append: Append) -> None:
    """Write one capture and record it (`repro_captured` with each section's digest), or record why it failed."""
    try:
        manifest = capture(request)
    except Exception as exc:  # the capture must never stop training
        log.warning("environment capture into %s failed: %s", request.dest, exc)
        append(Kind.REPRO_FAILED, node=node, reason=f"{type(exc).__name__}: {exc}")
        return
    append(
        Kind.REPRO_CAPTURED,
        node=node,
        path=str(request.dest),
        seconds=manifest["capture_seconds"],
        failures={name: c["error"] for name, c in manifest["commands"].items() if not c["ok"]},
        sections={name: info["sha256"] for name, info in manifest["sections"].items()},
    )


def node_of(environ: Mapping[str, str]) -> int | None:
    """This process's node index when it is its node's first rank (the one that captures), else None.

    The local rank comes from the launcher (torchrun's LOCAL_RANK, srun's SLURM_LOCALID), else the global RANK (a
    launch that names no local rank is taken as one node); the node from SLURM_NODEID, else torchrun's GROUP_RANK."""
    local = environ.get("LOCAL_RANK") or environ.get("SLURM_LOCALID") or environ.get("RANK") or "0"
    node = environ.get("SLURM_NODEID") or environ.get("GROUP_RANK") or "0"
    if local != "0" or not node.isdigit():  # not the first rank, or a launcher's value that is no number: no capture
        return None
    return int(node)


def start_for_script(run_dir: Path, job_id: str, restart: int, environ: Mapping[str, str]) -> subprocess.Popen | None:
    """On its node's first rank, start the capture of this attempt as a process of its own; elsewhere nothing.

    Its output goes nowhere (a launcher or a test that reads the rank's pipes must not wait for it); it stays in the
    rank's process group, so a signal to the job's group ends it too."""
    node = node_of(environ)
    if node is None:
        return None
    command = [sys.executable, "-m", __name__, str(os.getpid()), str(run_dir), job_id, str(restart), str(node), *sys.argv]
    try:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    except OSError as exc:
        log.warning("could not start the environment capture: %s", exc)
        return None
    # The stack section from here, where torch is imported already: the capture's process then never imports it (2 s
    # of CPU). A few KiB, within a pipe's buffer, so the write does not wait for the process to read.
    assert process.stdin is not None  # stdin=PIPE
    with contextlib.suppress(OSError):
        process.stdin.write(stack_text())
        process.stdin.close()
    return process


def end_for_script(process: subprocess.Popen | None) -> None:
    """At the loop's end: let a capture still running finish for up to END_WAIT_S, then kill it."""
    if process is None:
        return
    try:
        process.wait(timeout=END_WAIT_S)
    except subprocess.TimeoutExpired:
        log.warning("the environment capture still ran when the loop ended; it was stopped and this attempt has none")
        process.kill()
        process.wait()


def _capture_script_attempt(run_dir: Path, job_id: str, restart: int, node: int, argv: list[str], stack: str) -> None:
    """The started process's work: the capture a script's attempt gets, with the default allowlist and redaction."""
    paths = RunPaths(run_dir)
    defaults = ReproSection()
    redactor = Redactor(frozenset(defaults.allow), tuple(defaults.deny), key=run_key(paths.repro))
    request = CaptureRequest(
        paths.capture(job_id, restart, node),
        redactor,
        defaults.command_timeout_s,
        argv=("script:", *argv),
        code_paths=(Path(argv[0]).resolve().parent,) if argv and argv[0].endswith(".py") else (),
        labels={"job_id": job_id, "attempt": restart, "node": node, "executor": SCRIPT_EXECUTOR},
        stack=stack or None,
    )

    def append(kind: Kind, **fields: Any) -> None:
        append_record(run_dir, new_record(kind, {"job_id": job_id, "restart": restart, **fields}), scrub=redactor.text)

    capture_and_record(request, node, append)


if __name__ == "__main__":
    die_with_parent(int(sys.argv[1]))
    _capture_script_attempt(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:], sys.stdin.read())
