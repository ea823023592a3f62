"""`legato train`: the trainer without a scheduler, launched again after every stop at a checkpoint until it ends.

Each attempt is `python -m legato CONFIG` in the foreground (so Ctrl-C and the
terminal reach it); an exit 75 means it stopped at a committed checkpoint, an
exit 124 that the hang watchdog ended it (a hang it had not met before), and
the next attempt resumes from the newest checkpoint. This module must never print: each
attempt's outcome goes to the `notify` callback, which the CLI puts in words.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_HUNG, EXIT_STOPPED
from legato.orchestrator.runstate import final_manifest

MAX_LOCAL_ATTEMPTS = 100

Notify = Callable[[str, dict], None]


def trainer_command(config: str, nproc: int | None, overrides: Sequence[str]) -> list[str]:
    """The argv of one attempt: the trainer's own entry with the same config, ranks and overrides."""
    cmd = [sys.executable, "-m", "legato", str(config)]
    if nproc is not None:
        cmd += ["--nproc", str(nproc)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def train_locally(cmd: list[str], run_dir: Path, notify: Notify) -> int:
    """Launch `cmd` until it exits other than 75 or 124; its last exit code, or EXIT_FAILED after MAX_LOCAL_ATTEMPTS.

    `notify` hears "started" (attempt, argv), then "stopped", "hung" or "ended" (attempt, code, manifest: the newest
    checkpoint's or None), and "gave_up" (attempts).
    """
    for attempt in range(1, MAX_LOCAL_ATTEMPTS + 1):
        notify("started", {"attempt": attempt, "argv": cmd[1:]})
        code = subprocess.call(cmd)
        outcome = {"attempt": attempt, "code": code, "manifest": final_manifest(run_dir)}
        if code not in (EXIT_STOPPED, EXIT_HUNG):
            notify("ended", outcome)
            return code
        notify("stopped" if code == EXIT_STOPPED else "hung", outcome)
    notify("gave_up", {"attempts": MAX_LOCAL_ATTEMPTS})
    return EXIT_FAILED
