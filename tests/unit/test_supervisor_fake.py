"""The supervisor's decisions against a scripted scheduler (tests/fake_backend.py): each test runs in-process in
milliseconds. The same decisions against real jobs: tests/test_supervisor.py, test_orphans.py, test_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fake_backend import FakeBackend, Step, ended, pending, running, still

from legato.config import Config, load_config
from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_RESUME_MISMATCH, EXIT_USAGE
from legato.orchestrator import supervisor as supervisor_module
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.supervisor import Supervisor, start_session

FINISHED = {"event": "finished", "restart": 0, "step": 60}


def _config(tmp_path: Path, *sets: str) -> Config:
    return load_config(None, ["executor=slurm", f"run.dir={tmp_path / 'run'}", *sets])


def _supervise(cfg: Config, *scripts: list[Step], broken: dict[str, str] | None = None) -> tuple[int, FakeBackend, list[dict]]:
    """Start a session and supervise it to its end on the fake; returns the exit code, the fake and the ledger."""
    ledger = Ledger(cfg.run_dir)
    start_session(cfg, ledger, ["legato", "run"])
    fake = FakeBackend(ledger, list(scripts), broken_nodes=broken or {})
    code = Supervisor(cfg, cfg.run_dir / "config.yaml", notify=lambda kind, data: None, poll_s=0.0, backend=fake).run()
    return code, fake, ledger.read()


def _events(ledger: list[dict], name: str) -> list[dict]:
    return [e for e in ledger if e["event"] == name]


def test_a_job_that_waits_then_finishes_is_submitted_once_and_every_state_change_is_recorded(tmp_path: Path) -> None:
    code, fake, ledger = _supervise(
        _config(tmp_path), [pending("Priority"), pending("Resources"), running(), still(), ended("COMPLETED", FINISHED)]
    )
    assert code == EXIT_OK
    assert [job for job, _ in fake.submitted] == ["101"]
    assert [e["state"] for e in _events(ledger, "job_state")] == ["PENDING", "RUNNING", "COMPLETED"]
    assert fake.cancelled == []


def test_a_pending_job_says_why_it_waits(tmp_path: Path) -> None:
    fake = FakeBackend(Ledger(tmp_path), [[pending("QOSMaxJobsPerUserLimit")]])
    job_id = fake.submit(_config(tmp_path), task=lambda: None)
    state = fake.state(job_id)
    assert (state.name, state.active, state.reason) == ("PENDING", True, "QOSMaxJobsPerUserLimit")


def test_a_job_that_requeues_itself_at_a_checkpoint_is_not_resubmitted(tmp_path: Path) -> None:
    stop = {"event": "requeued", "restart": 0, "last_step": 20, "budget_left": 9}
    resumed = {"event": "resumed", "restart": 1, "step": 20, "match": True}
    script = [running(0, ("n1",), stop), pending("BeginTime"), running(1, ("n1",), resumed), ended("COMPLETED", {**FINISHED, "restart": 1})]
    code, fake, ledger = _supervise(_config(tmp_path), script)
    assert code == EXIT_OK
    assert len(fake.submitted) == 1 and not _events(ledger, "resubmitted")


def test_a_resume_that_did_not_verify_ends_with_the_mismatch_code(tmp_path: Path) -> None:
    resumed = {"event": "resumed", "restart": 1, "step": 20, "match": False}
    script = [
        running(0),
        still("RUNNING", {"event": "requeued", "restart": 0}),
        running(1, ("n1",), resumed),
        ended("COMPLETED", {**FINISHED, "restart": 1}),
    ]
    code, _, _ = _supervise(_config(tmp_path), script)
    assert code == EXIT_RESUME_MISMATCH


def test_a_node_failure_resubmits_without_the_failed_node(tmp_path: Path) -> None:
    first = [running(0, ("n1", "n2")), ended("NODE_FAIL")]
    second = [pending(), running(0, ("n1", "n3")), ended("COMPLETED", FINISHED)]
    code, fake, ledger = _supervise(_config(tmp_path, "slurm.nodes=2", "slurm.tasks_per_node=1"), first, second, broken={"n2": "down*"})
    assert code == EXIT_OK
    assert fake.submitted == [("101", ()), ("102", ("n2",))]
    (resubmitted,) = _events(ledger, "resubmitted")
    assert resubmitted["previous_job_id"] == "101" and resubmitted["reason"] == "NODE_FAIL"
    assert resubmitted["failed_nodes"] == {"n2": "down*"} and resubmitted["excluded"] == ["n2"]


def test_the_requeue_budget_ends_the_run(tmp_path: Path) -> None:
    crash = [running(0), ended("FAILED")]
    code, fake, ledger = _supervise(_config(tmp_path, "slurm.max_requeues=1"), crash, crash)
    assert code == EXIT_FAILED
    assert len(fake.submitted) == 2
    (failed,) = _events(ledger, "failed")
    assert failed["job_id"] == "102" and "requeue budget exhausted" in failed["reason"] and "slurm.max_requeues is 1" in failed["reason"]


def test_a_job_whose_rank_lost_its_peers_is_cancelled_after_the_grace_and_resubmitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "LOST_RANK_GRACE_S", 0.0)
    lost = {"event": "rank_lost", "restart": 0, "reason": "a rank lost its peers (timeout)", "checkpoint_step": 10}
    hanging = [running(0, ("n1",), lost), still()]  # one task hangs on its way out: the job never ends by itself
    code, fake, ledger = _supervise(_config(tmp_path), hanging, [running(0), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK
    assert fake.cancelled == ["101"]
    assert [e["job_id"] for e in _events(ledger, "lost_rank_cancel")] == ["101"]
    (resubmitted,) = _events(ledger, "resubmitted")
    assert resubmitted["reason"] == "CANCELLED: a rank lost its peers (timeout)"


HANG = {
    "event": "hang",
    "restart": 0,
    "rank": 0,
    "host": "n1",
    "step": 12,
    "phase": "step",
    "quiet_s": 181.0,
    "bound_s": 180.0,
    "frame": "train.py:40 in load",
    "user_frame": "train.py:40 in load",
    "stopped": [],
    "stacks": "hangs/101/1",
    "repeated": False,
}


def test_a_hung_job_is_resubmitted_naming_the_hang_and_a_task_left_behind_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "LOST_RANK_GRACE_S", 0.0)
    hung = [running(0, ("n1",), HANG), still()]  # a stopped rank on another node never ends by itself
    code, fake, ledger = _supervise(_config(tmp_path), hung, [running(0), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK and fake.cancelled == ["101"]
    (resubmitted,) = _events(ledger, "resubmitted")
    assert resubmitted["reason"].startswith("CANCELLED: hung at step 12") and "train.py:40 in load" in resubmitted["reason"]


def test_the_same_hang_again_fails_the_run_instead_of_resubmitting_it(tmp_path: Path) -> None:
    again = {**HANG, "repeated": True, "stacks": "hangs/101/2"}
    code, fake, ledger = _supervise(_config(tmp_path), [running(0, ("n1",), again), ended("FAILED")])
    assert code == EXIT_FAILED and len(fake.submitted) == 1
    (failed,) = _events(ledger, "failed")
    assert "exactly where an earlier attempt hung" in failed["reason"] and "hangs/101/2/" in failed["reason"]


def test_a_run_that_failed_while_its_job_still_runs_cancels_the_leftover_job(tmp_path: Path) -> None:
    refused = {"event": "failed", "restart": 0, "exit_code": EXIT_USAGE, "reason": "rank 0 refused a setting"}
    code, fake, ledger = _supervise(_config(tmp_path), [running(0, ("n1",), refused), still()])
    assert code == EXIT_USAGE
    assert fake.cancelled == ["101"] and [e["job_id"] for e in _events(ledger, "leftover_cancel")] == ["101"]


def test_a_job_that_ended_before_training_fails_the_run_without_a_resubmission(tmp_path: Path) -> None:
    code, fake, ledger = _supervise(_config(tmp_path), [pending(), ended("FAILED")])
    assert code == EXIT_FAILED
    assert len(fake.submitted) == 1
    (failed,) = _events(ledger, "failed")
    assert "before any of its tasks started training" in failed["reason"]
