"""How the SLURM backend reads a job's state, with fake `sacct` and `scontrol` on PATH (shell scripts printing what the
real tools print; the real SLURM is tests/cluster's): a job preempted under PreemptMode=REQUEUE ends an instance that
sacct calls PREEMPTED while the controller already holds it PENDING again, and the supervisor must not take it for
ended (it would submit a second job beside the one SLURM requeued).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from legato.slurm.cluster import slurm_state


def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sacct: str, scontrol: str | None) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(f"#!/bin/sh\nprintf '{sacct}'\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho '{scontrol}'\n" if scontrol else "#!/bin/sh\nexit 1\n")
    for tool in ("sacct", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_preempted_instance_of_a_requeued_job_reads_as_the_controllers_pending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tools(tmp_path, monkeypatch, "PREEMPTED\\n", "JobId=7 JobName=train JobState=PENDING Reason=BeginTime Requeue=1")
    assert slurm_state("7") == "PENDING"


def test_a_preempted_job_the_controller_no_longer_knows_stays_preempted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tools(tmp_path, monkeypatch, "PREEMPTED\\n", None)
    assert slurm_state("7") == "PREEMPTED"


def test_any_other_state_is_saccts_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tools(tmp_path, monkeypatch, "COMPLETED\\n", "JobId=7 JobState=PENDING")
    assert slurm_state("7") == "COMPLETED"
