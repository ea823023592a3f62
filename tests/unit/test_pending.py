"""A pending job said aloud, against the fake scheduler (tests/helpers/fake_backend.py, in-process, milliseconds):
SLURM's reason goes to the ledger as it changes and to the live line with the time waited; a reason that can never
clear ends the run with exit 1, the reason and the fix, and the job cancelled. The same against the real SLURM:
tests/cluster/test_slurm.py::test_a_job_slurm_can_never_start_ends_the_run_at_once."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from helpers.fake_backend import FakeBackend, ended, never_starts, pending, running

from legato.config import load_config
from legato.errors import EXIT_FAILED, EXIT_OK
from legato.orchestrator.display import LiveView, waiting_line
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.supervisor import Supervisor, start_session
from legato.orchestrator.waiting import waiting_job
from legato.slurm import pending as reasons

FINISHED = {"event": "finished", "restart": 0, "step": 60}
FIX = "it asks for 2 node(s) and partition debug has 1 node(s) (MaxNodes UNLIMITED). Lower slurm.nodes to 1 or less."


def supervise(tmp_path: Path, *scripts) -> tuple[int, FakeBackend, list[dict], list[tuple[str, dict]]]:
    cfg = load_config(None, ["executor=slurm", f"run.dir={tmp_path / 'run'}"])
    ledger = Ledger(cfg.run_dir)
    start_session(cfg, ledger, ["legato", "run"])
    fake, told = FakeBackend(ledger, list(scripts)), []
    code = Supervisor(cfg, cfg.run_dir / "config.yaml", notify=lambda kind, data: told.append((kind, data)), poll_s=0.0, backend=fake).run()
    return code, fake, ledger.read(), told


def test_a_reason_that_can_never_clear_ends_the_run_with_the_reason_the_fix_and_the_job_cancelled(tmp_path: Path) -> None:
    code, fake, ledger, _ = supervise(tmp_path, [pending("None"), never_starts("PartitionNodeLimit", FIX)])
    assert code == EXIT_FAILED
    assert fake.cancelled == ["101"] and len(fake.submitted) == 1
    (failed,) = [e for e in ledger if e["event"] == "failed"]
    assert failed["exit_code"] == EXIT_FAILED and failed["job_id"] == "101"
    assert "job 101 can never start: fake keeps it pending with reason PartitionNodeLimit, and " + FIX in failed["reason"]
    assert "Job 101 was cancelled" in failed["reason"]
    assert [e["reason"] for e in ledger if e["event"] == "pending_reason"] == ["None", "PartitionNodeLimit"]
    assert not [e for e in ledger if e["event"] == "leftover_cancel"], "cancelled once, by the refusal itself"


def test_a_transient_reason_is_recorded_as_it_changes_and_shown_with_the_time_waited(tmp_path: Path) -> None:
    script = [pending("Priority"), pending("Priority"), pending("Resources"), running(), ended("COMPLETED", FINISHED)]
    code, fake, ledger, told = supervise(tmp_path, script)
    assert code == EXIT_OK and fake.cancelled == []
    assert [e["reason"] for e in ledger if e["event"] == "pending_reason"] == ["Priority", "Resources"]
    waits = [data for kind, data in told if kind == "waiting"]
    assert {w["reason"] for w in waits} == {"Priority", "Resources"} and all(w["job_id"] == "101" and w["waited_s"] >= 0 for w in waits)
    assert waiting_job(ledger, now=ledger[-1]["time"]) is None, "a job that started no longer waits"
    view = LiveView(io.StringIO())
    view("waiting", waits[-1])
    shown = view.stream.getvalue()
    assert "job 101 pending for 0m" in shown and "Resources (waiting for nodes or CPUs to free up)" in shown


def test_the_time_waited_counts_from_the_submission() -> None:
    session = [
        {"event": "run_started", "time": 100.0},
        {"event": "submitted", "job_id": "7", "time": 101.0},
        {"event": "job_state", "job_id": "7", "state": "PENDING", "time": 104.0},
        {"event": "pending_reason", "job_id": "7", "reason": "Priority", "time": 104.0},
        {"event": "pending_reason", "job_id": "7", "reason": "Resources", "time": 130.0},
    ]
    assert waiting_job(session, now=226.0) == {"job_id": "7", "reason": "Resources", "waited_s": 125.0}
    assert waiting_line(waiting_job(session, now=226.0)) == "job 7 pending for 2m05s: Resources (waiting for nodes or CPUs to free up)"
    requeued = [
        *session,
        {"event": "job_state", "job_id": "7", "state": "RUNNING", "time": 140.0},
        {"event": "job_state", "job_id": "7", "state": "PENDING", "time": 200.0},
    ]
    assert waiting_job(requeued, now=226.0) == {"job_id": "7", "reason": None, "waited_s": 26.0}
    assert waiting_job([*session, {"event": "failed", "job_id": "7", "exit_code": 1, "reason": "x", "time": 131.0}], now=226.0) is None


def fake_scontrol(monkeypatch: pytest.MonkeyPatch, answers: dict[str, str | None]) -> None:
    """A fake `processes.output` (a fast unit test of the reading): answers by the command's first three words."""
    monkeypatch.setattr(reasons.processes, "output", lambda cmd, timeout=0: answers.get(" ".join(cmd[:3])))


def test_which_reasons_never_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(
        monkeypatch,
        {
            "scontrol show job": "JobId=7 Partition=debug NumNodes=2-2 TimeLimit=00:10:00 Account=nope QOS=normal Features=(null)",
            "scontrol show partition": "PartitionName=debug TotalNodes=1 MaxNodes=UNLIMITED MaxTime=00:05:00",
            "scontrol show hostnames": "n1 ghost",
            "scontrol show node": None,
        },
    )
    for transient in ("Resources", "Priority", "BeginTime", "None", None, "ReqNodeNotAvail"):
        assert reasons.blocked("7", transient) is None, transient
    assert "asks for 2 node(s) and partition debug has 1 node(s)" in reasons.blocked("7", "PartitionNodeLimit")
    assert "Lower slurm.nodes to 1 or less" in reasons.blocked("7", "PartitionConfig"), "SLURM 22.05's word for the same"
    too_long = reasons.blocked("7", "PartitionTimeLimit")
    assert "MaxTime (00:05:00)" in too_long and "slurm.time_min" in too_long
    assert "account 'nope'" in reasons.blocked("7", "InvalidAccount") and "slurm.account" in reasons.blocked("7", "InvalidAccount")
    assert "slurm.qos" in reasons.blocked("7", "InvalidQOS")
    assert "slurm.extra_sbatch" in reasons.blocked("7", "BadConstraints")
    assert "node(s) n1, ghost, which this cluster does not have" in reasons.blocked("7", "ReqNodeNotAvail, UnavailableNodes:n1,ghost")


def test_node_limits_and_node_lists_that_may_still_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(
        monkeypatch,
        {
            "scontrol show job": "JobId=7 Partition=debug NumNodes=2",
            "scontrol show partition": "PartitionName=debug TotalNodes=4 MaxNodes=UNLIMITED",
            "scontrol show hostnames": "n1",
            "scontrol show node": "NodeName=n1 State=DRAINED",
        },
    )
    assert reasons.blocked("7", "PartitionNodeLimit") is None, "2 of 4 nodes: it waits for drained ones to return"
    assert reasons.blocked("7", "PartitionConfig") is None
    assert reasons.blocked("7", "ReqNodeNotAvail, UnavailableNodes:n1") is None, "n1 exists: it may come back"
    fake_scontrol(monkeypatch, {})
    assert reasons.blocked("7", "PartitionConfig") is None, "scontrol silent: PartitionConfig may be anything, so it waits"
    assert "Lower slurm.nodes" in reasons.blocked("7", "PartitionNodeLimit"), "scontrol silent: the reason itself says it"


def test_legato_status_says_why_and_how_long_the_job_waits(tmp_path: Path) -> None:
    from helpers.cli import legato

    cfg = load_config(None, ["executor=slurm", f"run.dir={tmp_path / 'run'}"])
    ledger = Ledger(cfg.run_dir)
    start_session(cfg, ledger, ["legato", "run"])
    ledger.append("submitted", job_id="7", executor="slurm", config_digest="x")
    ledger.append("job_state", job_id="7", state="PENDING")
    ledger.append("pending_reason", job_id="7", reason="Priority")
    table = legato("status", str(cfg.run_dir))
    assert table.returncode == 0, table.stderr
    assert "job 7 pending for 0m" in table.stdout and "Priority (jobs of higher priority go first)" in table.stdout
    data = json.loads(legato("status", str(cfg.run_dir), "--json").stdout)
    assert data["waiting"]["job_id"] == "7" and data["waiting"]["reason"] == "Priority" and data["waiting"]["waited_s"] >= 0
