"""One attempt's environment capture on one node, recorded in the run's ledger: `legato run`'s job side calls
`capture_and_record` in its own process; a script's own Session starts `start_for_script`, a short process of its own.

A Session never waits for its capture: the capture runs `git`, `nvidia-smi` and `module` with timeouts and reads
every installed distribution, work a rank must not do between its start and its first step, and a thread for it
would be one more thread that starts and ends while the script's DataLoader may fork its workers. The process it
starts writes only under the run directory (`RUN/repro/JOB/ATTEMPT[/nodeN]` and the ledger) and never reads a
checkpoint. A failed capture is recorded (`repro_failed`), never raised: it must never stop training.

    python -m legato.repro.attempt RUN_DIR JOB_ID RESTART NODE [ARGV...]   (what `start_for_script` runs)
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from legato.config import ReproSection
from legato.events import SCRIPT_EXECUTOR, Kind
from legato.ledger_file import append_record, new_record
from legato.paths import RunPaths
from legato.repro.capture import CaptureRequest, capture
from legato.repro.redact import Redactor, run_key

log = logging.getLogger(__name__)

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
    if int(local) != 0:
        return None
    return int(environ.get("SLURM_NODEID") or environ.get("GROUP_RANK") or 0)


def start_for_script(run_dir: Path, job_id: str, restart: int, environ: Mapping[str, str]) -> subprocess.Popen | None:
    """On its node's first rank, start the capture of this attempt as a process of its own; elsewhere nothing.

    Its output goes nowhere (a launcher or a test that reads the rank's pipes must not wait for it); it stays in the
    rank's process group, so a signal to the job's group ends it too."""
    node = node_of(environ)
    if node is None:
        return None
    command = [sys.executable, "-m", __name__, str(run_dir), job_id, str(restart), str(node), *sys.argv]
    try:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        log.warning("could not start the environment capture: %s", exc)
        return None


def _capture_script_attempt(run_dir: Path, job_id: str, restart: int, node: int, argv: list[str]) -> None:
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
    )

    def append(kind: Kind, **fields: Any) -> None:
        append_record(run_dir, new_record(kind, {"job_id": job_id, "restart": restart, **fields}), scrub=redactor.text)

    capture_and_record(request, node, append)


if __name__ == "__main__":
    _capture_script_attempt(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
