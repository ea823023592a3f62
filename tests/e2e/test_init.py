"""`legato init`: the three files it writes work as written, and it never overwrites a file.

Run as a user would, in a fresh folder: the ported script under `python -m legato.torchrun` proved bit for bit by
`legato verify --command` (the stop after step 20 planted by the verifier, the relaunch resumed and replayed); the
config under `legato run` (local executor, PYTHONPATH=. from the folder, as the files say); the job script is
valid bash that runs the same launcher line and requeues through `legato requeue` (it runs under SLURM in
tests/cluster, not here). A second `legato init` into the folder, or a bad name, is refused (exit 2, one paragraph)
and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import legato, status

from legato.runtime.launch import free_port

pytestmark = pytest.mark.slow


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_the_written_script_config_and_job_script_work_as_written(tmp_path: Path) -> None:
    folder = tmp_path / "start"
    made = legato("init", str(folder), "--name", "demo", "--steps", "40")
    assert made.returncode == 0, made.stderr
    assert sorted(digests(folder)) == ["config.yaml", "job.sbatch", "train.py"]

    launch = f"{sys.executable} -m legato.torchrun --nproc-per-node 2 --master-port {free_port()} train.py {{run_dir}}"
    proved = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.orchestrator.cli",
            "verify",
            "--command",
            launch,
            "--interrupt-at",
            "20",
            "--out",
            "verify",
            "--json",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proved.returncode == 0, proved.stdout[-2000:] + proved.stderr[-2000:]
    verdict = json.loads((folder / "verify" / "verdict.json").read_text())
    assert verdict["identical"] and [r["step"] for r in verdict["resumes"]] == [21], verdict

    env = dict(os.environ, PYTHONPATH=".", PYTHONWARNINGS="ignore")
    supervised = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "run", "config.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert supervised.returncode == 0, supervised.stdout[-2000:] + supervised.stderr[-2000:]
    assert status(folder / "runs" / "demo-supervised")["state"] == "finished"

    job = (folder / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(folder / "job.sbatch")]).returncode == 0
    assert "srun python -m legato.torchrun --nproc-per-node 2 train.py runs/demo" in job
    assert "exec legato requeue runs/demo --exit-code $?" in job and "--signal=USR2@120" in job


def test_nothing_is_overwritten_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "start"
    folder.mkdir()
    (folder / "train.py").write_text("# the user's own script\n")
    before = digests(folder)
    again = legato("init", str(folder))
    assert again.returncode == 2 and "already has train.py; nothing was written" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr and digests(folder) == before
    bad = legato("init", str(tmp_path / "other"), "--name", "my run; rm -rf /")
    assert bad.returncode == 2 and "--name must be" in bad.stderr and not (tmp_path / "other").exists()
