"""A full disk under a real 2-rank run: checkpoints written onto a real tmpfs of 3 MiB (in a mount namespace of the
test's own, helpers/full_disk.py) that fills up after two of them. A checkpoint no rank can finish is agreed by every
rank, its partial files are removed, and the run says so in one paragraph and goes on (periodic), stops without it
(a stop: exit 75) or ends unsaved (final: exit 1); never a traceback or a hang. With room again, the run resumes from
the checkpoint that stood and ends on the bits of a run that never lacked room. The same when only the manifest of a
background checkpoint finds no room: every rank hears of it from rank 0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, manifest
from helpers.cli import legato

pytestmark = pytest.mark.slow

FULL_DISK = ROOT / "tests" / "helpers" / "full_disk.py"


def mounts_allowed() -> bool:
    """Whether this process may make a mount namespace and mount a tmpfs in it (root, and a kernel that lets it)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


def drive(out: Path, size_kb: int, *launches: str, background: bool = False, env: dict[str, str] | None = None) -> list[dict]:
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, str(FULL_DISK), str(out), str(size_kb), *launches]
    env = dict(os.environ, PYTHONPATH=str(ROOT), FULL_DISK_ASYNC="1" if background else "0", **(env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"launch{i}.json").read_text()) for i in range(len(launches))]


MOUNTS = pytest.mark.skipif(not mounts_allowed(), reason="needs root and mount namespaces, to give the run a small real filesystem")


@MOUNTS
def test_a_full_disk_is_agreed_cleaned_up_and_said_and_the_run_resumes_exactly_once_there_is_room(tmp_path: Path) -> None:
    stopped, ended, resumed = drive(tmp_path / "run", 3072, "0:12", "0:0", "65536:0")

    assert stopped["codes"] == [75, 75], stopped["stderr"][0][-3000:]
    assert "signal checkpoint step 13 could not be written (rank 0: [Errno 28] No space left on device" in stopped["stderr"][0]
    assert "The ranks stop without it: the next attempt resumes from step 10" in stopped["stderr"][0]
    assert ended["codes"] == [1, 1], ended["stderr"][0][-3000:]
    assert "periodic checkpoint step 15 could not be written (rank 0: [Errno 28] No space left on device" in ended["stderr"][0]
    assert "final checkpoint step 20 could not be written" in ended["stderr"][0] and "the run is not done" in ended["stderr"][0]
    for launch in (stopped, ended):
        assert launch["checkpoints"] == ["step_10", "step_5"], "partial files left behind"
        assert not any("Traceback" in err for err in launch["stderr"]), launch["stderr"][0][-3000:]

    assert resumed["codes"] == [0, 0], resumed["stderr"][0][-3000:]
    assert "resumed at step 10" in resumed["stderr"][0] and "verified" in resumed["stderr"][0]
    ledger = [json.loads(line) for line in (tmp_path / "run" / "run" / "ledger.jsonl").read_text().splitlines()]
    failed = [(e["reason"], e["step"], e["standing"]) for e in ledger if e["event"] == "checkpoint_failed"]
    assert failed == [("signal", 13, 10), ("periodic", 15, 10), ("final", 20, 10)]
    assert [e["step"] for e in ledger if e["event"] == "attempt_stopped"] == [10]

    shown = legato("status", str(tmp_path / "run" / "run"))
    assert shown.returncode == 0 and "ended unsaved: final checkpoint not written" in shown.stdout, shown.stdout
    (reference,) = drive(tmp_path / "reference", 65536, "0:0")
    assert reference["codes"] == [0, 0]
    assert manifest(tmp_path / "run" / "run", 20)["global_hash"] == manifest(tmp_path / "reference" / "run", 20)["global_hash"]


@MOUNTS
def test_a_background_checkpoint_that_finds_the_disk_full_is_abandoned_said_and_cleaned_up(tmp_path: Path) -> None:
    (ended,) = drive(tmp_path / "run", 3072, "0:0", background=True)
    assert ended["codes"] == [1, 1], ended["stderr"][0][-3000:]
    assert "periodic checkpoint step 15 could not be written (rank 0: [Errno 28] No space left on device" in ended["stderr"][0]
    assert "final checkpoint step 20 could not be written" in ended["stderr"][0]
    assert ended["checkpoints"] == ["step_10", "step_5"], "partial files left behind"
    assert not any("Traceback" in err for err in ended["stderr"]), ended["stderr"][0][-3000:]


@MOUNTS
def test_a_background_checkpoint_whose_manifest_finds_the_disk_full_is_abandoned_by_every_rank(tmp_path: Path) -> None:
    """Every rank's files of step 15 are durable, then the disk fills: rank 0's manifest write fails. Every rank hears
    of it (no rank counts step 15 as on disk), the run goes on and ends on the bits of a run that never lacked room."""
    (ended,) = drive(tmp_path / "run", 65536, "0:0", background=True, env={"FULL_DISK_FILL_AFTER": "15"})
    assert ended["codes"] == [0, 0], ended["stderr"][0][-3000:]
    assert "periodic checkpoint step 15 could not be written (rank 0: [Errno 28] No space left on device" in ended["stderr"][0]
    assert not any("Traceback" in err for err in ended["stderr"]), ended["stderr"][0][-3000:]
    assert ended["checkpoints"] == ["step_10", "step_20", "step_5"], "the abandoned checkpoint left files behind"
    ledger = [json.loads(line) for line in (tmp_path / "run" / "run" / "ledger.jsonl").read_text().splitlines()]
    assert [(e["reason"], e["step"], e["standing"]) for e in ledger if e["event"] == "checkpoint_failed"] == [("periodic", 15, 10)]

    (reference,) = drive(tmp_path / "reference", 65536, "0:0", background=True)
    assert reference["codes"] == [0, 0]
    assert manifest(tmp_path / "run" / "run", 20)["global_hash"] == manifest(tmp_path / "reference" / "run", 20)["global_hash"]


@MOUNTS
def test_a_checkpoints_filesystem_turned_read_only_is_named_as_such_not_as_full(tmp_path: Path) -> None:
    """After step 7 the checkpoints' filesystem is remounted read-only: the periodic checkpoint at 10 and the final one
    fail, and the run says the filesystem is read-only and how to fix that (it said "free space" before); the
    checkpoint at step 5 stands."""
    (ended,) = drive(tmp_path / "run", 65536, "0:0", env={"FULL_DISK_READ_ONLY_AFTER": "7"})
    said = ended["stderr"][0]
    assert ended["codes"] == [1, 1], said[-3000:]
    assert "periodic checkpoint step 10 could not be written (rank 0: [Errno 30] Read-only file system" in said, said[-3000:]
    assert "the checkpoints' filesystem is read-only; the checkpoint at step 5 stands" in said, said[-3000:]
    assert "remount it writable (or move the run directory to one that is) before the run stops" in said
    assert "free space" not in said.lower() and "Traceback" not in said
    assert ended["checkpoints"] == ["step_5"]
