"""Runs built once per suite and read by every test that needs the same one: an uninterrupted reference, a run
stopped at a given step. Several tests of several modules used to train the very same run (same config, same
settings, same ranks), each paying its ranks' start-up again.

A shared run is keyed by a name that must say everything that makes its bits (config, settings, ranks): two tests
asking for one key get one directory. It is built by the first test that asks for it, under a file lock in the
folder every xdist worker of this pytest session shares, so that the other workers wait for it instead of building
it too. A build goes into a folder of its own and is renamed into place once it succeeded, so that nothing a failed
build left running writes into the run the others read; a failed build is recorded, and every later test that asks
for it fails at once, naming the first failure, instead of training it again. The directory is read-only by
contract: a test that resumes, damages or extends a run copies it first (`copy_of`); the runs copied so (`python -m
legato` runs) resume from a copy as from themselves.

This module must never hold a test's assertion: what a run must show is checked by the tests that read it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

FAILED = "failed.txt"  # why the build of a key failed: later askers fail with it


class SharedRuns:
    """The suite's shared runs, under `root` (one folder per key)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str, build: Callable[[Path], object]) -> Path:
        """The run for `key`, built by `build(run_dir)` if no test built it yet in this pytest session."""
        folder = self.root / key
        run_dir, failed = folder / "run", folder / FAILED
        with FileLock(str(self.root / f"{key}.lock")):
            if failed.exists():
                raise AssertionError(f"the shared run {key} failed to build in an earlier test:\n{failed.read_text()}")
            if not run_dir.exists():
                building = Path(tempfile.mkdtemp(prefix="building-", dir=self.root)) / "run"
                try:
                    building.mkdir()
                    build(building)
                except BaseException as exc:
                    folder.mkdir(exist_ok=True)
                    failed.write_text(f"{type(exc).__name__}: {str(exc)[-3000:]}")
                    raise
                folder.mkdir(exist_ok=True)
                building.rename(run_dir)
                building.parent.rmdir()
        return run_dir

    def copy_of(self, key: str, build: Callable[[Path], object], into: Path) -> Path:
        """A copy of the run for `key` at `into` (an empty or absent directory), for a test that changes it."""
        shutil.copytree(self.get(key, build), into, dirs_exist_ok=True)
        return into


def run_key(*parts: str) -> str:
    """A folder name for the run that `parts` describe in full (the command's config, settings, ranks)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def shared_root(basetemp: Path) -> Path:
    """The folder the workers of one pytest session share: the parent of each xdist worker's own base temp, else the
    session's base temp itself (never a folder a later session would find)."""
    root = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder = root / "shared-runs"
    folder.mkdir(exist_ok=True)
    return folder
