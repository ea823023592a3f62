"""The run directory as the supervisor owns it: what it holds (a script's run, a started run, the newest run under
./runs), the captured config, the supervisor lock.

The resolved config is captured as `<run_dir>/config.yaml`, which is what every job reads, once `legato.orchestrator
.preflight` found that it can continue what the directory holds. One supervisor per run directory: the lock is an OS
file lock, released when its holder dies. This module never deletes or rewrites anything but the captured config, and
imports nothing of a scheduler: `legato status` reads a run through it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import yaml
from filelock import FileLock, Timeout

from legato.config import Config, config_from_dict
from legato.errors import UsageError
from legato.events import Kind
from legato.files import write_atomic
from legato.orchestrator.ledger import Ledger
from legato.paths import RunPaths
from legato.repro.redact import Redactor
from legato.treediff import changed_leaves


def has_started(run_dir: Path) -> bool:
    """Whether a run has written to `run_dir`: `legato run`'s captured config, or a script's first attempt in the ledger."""
    return RunPaths(run_dir).config.is_file() or is_script_run(run_dir)


def is_script_run(run_dir: Path) -> bool:
    """Whether `run_dir` was written by a script's own Session: a ledger with attempts, and no config from `legato run`."""
    return not RunPaths(run_dir).config.is_file() and any(e["event"] == Kind.ATTEMPT_STARTED for e in Ledger(run_dir).read())


def redact_config(cfg: Config) -> tuple[Config, list[str]]:
    """The config as legato may write it (secret-looking values replaced), and the keys that were hidden.

    Jobs read the captured config, so a hidden value does not reach them: secrets belong in the
    environment, which jobs inherit and legato never writes out unredacted.
    """
    redactor = Redactor.from_config(cfg)
    raw = cfg.to_dict()
    clean = redactor.tree(raw)
    # A hidden key path can itself hold the secret (a token used as a mapping key): judge the path too.
    hidden = sorted({redactor.words(key) for key, _, _ in changed_leaves(raw, clean)})
    setup = [key for key in hidden if key.startswith("slurm.setup.")]
    if setup:
        line = int(setup[0].rsplit(".", 1)[1]) + 1
        raise UsageError(
            f"slurm.setup line {line} holds what looks like a secret, and setup lines are written into the sbatch "
            "script in the run directory. Export it in the shell that runs `legato run` instead: SLURM passes the "
            "environment on to the job, and legato never writes it unredacted."
        )
    return config_from_dict(clean, "the config"), hidden


def capture_config(cfg: Config) -> Path:
    """Write the resolved config (with an absolute run.dir) where every job of the run reads it."""
    run_dir = cfg.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    data = cfg.to_dict()
    data["run"]["dir"] = str(run_dir)
    path = RunPaths(run_dir).config
    write_atomic(
        path, "# Captured by legato run: the resolved config every job of this run reads.\n" + yaml.safe_dump(data, sort_keys=False)
    )
    return path


def captured_config(run_dir: Path) -> Path:
    """The config captured in `run_dir` by `legato run`; a UsageError when the directory is not a legato run."""
    path = RunPaths(run_dir).config
    if not path.is_file():
        raise UsageError(
            f"{run_dir} is not a legato run directory (it has no {path.name}). Pass the run.dir of a run started with `legato run`."
        )
    return path


class SupervisorLock:
    """At most one supervisor per run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._lock = FileLock(str(RunPaths(self.run_dir).supervisor_lock))

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise UsageError(
                f"Another legato supervisor is attached to {self.run_dir} ({self.holder()}). Follow it with "
                f"`legato watch {self.run_dir}`, or stop it first; two supervisors on one run would submit twice."
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        RunPaths(self.run_dir).supervisor_holder.write_text(json.dumps(info))

    def held_elsewhere(self) -> bool:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return True
        self._lock.release()
        return False

    def release(self) -> None:
        self._lock.release()

    def holder(self) -> str:
        try:
            info = json.loads(RunPaths(self.run_dir).supervisor_holder.read_text())
        except (OSError, json.JSONDecodeError):
            return "holder unknown"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on {info['host']}, since {started}"


def newest_run() -> Path:
    """The run directory under ./runs whose ledger changed last; a UsageError when there is none."""
    ledgers = sorted((p for p in Path("runs").glob("*/") if RunPaths(p).ledger.is_file()), key=lambda p: RunPaths(p).ledger.stat().st_mtime)
    if not ledgers:
        raise UsageError("No run directory given and none under ./runs has a ledger. Pass the run.dir of a run started with `legato run`.")
    return ledgers[-1]
