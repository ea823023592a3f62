"""The user's command run once a supervised run has ended (finished, failed or cancelled): a chat message, a mail,
a webhook.

The command comes from the supervisor's environment (`LEGATO_NOTIFY_COMMAND`), never from the config, so a webhook's
token is never written to the run directory: the config is captured there, and an environment capture records that
variable only as a keyed fingerprint. It runs through `sh -c`; what it reports (LEGATO_RUN_DIR, LEGATO_RUN_STATE,
LEGATO_RUN_REASON) is in its environment, never spliced into its text. Its output goes nowhere (it may print the
token), it gets HOOK_TIMEOUT_S, and a failure is reported, never fatal: the run's exit code stays the run's. This
module must never write anything, in the run directory or elsewhere.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from legato.repro.redact import NOTIFY_ENV

HOOK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HookOutcome:
    """How the command ended: its exit code, or why it has none (it could not start, or ran past the timeout)."""

    code: int | None
    error: str | None = None


def run_end_hook(run_dir: Path, state: str, reason: str | None, environ: Mapping[str, str] = os.environ) -> HookOutcome | None:
    """Run the end command for a run that ended in `state` (with `reason`); None when no command is set."""
    command = environ.get(NOTIFY_ENV, "").strip()
    if not command:
        return None
    env = {**environ, "LEGATO_RUN_DIR": str(run_dir.resolve()), "LEGATO_RUN_STATE": state, "LEGATO_RUN_REASON": reason or ""}
    try:
        done = subprocess.run(
            ["sh", "-c", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=HOOK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return HookOutcome(None, f"still ran after {HOOK_TIMEOUT_S:.0f}s and was stopped")
    except OSError as exc:
        return HookOutcome(None, f"could not start: {exc.strerror or exc}")
    return HookOutcome(done.returncode)
