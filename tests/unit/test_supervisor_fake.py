"""The supervisor's decisions against a scripted scheduler (tests/fake_backend.py): each test runs in-process in
milliseconds. The same decisions against real jobs: tests/test_supervisor.py, test_orphans.py, test_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fake_backend import FakeBackend, Step, ended, pending, running, still

from legato.config import Config, load_config
from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_RESUME_MISMATCH, EXIT_USAGE
from legato.orchestrator import supervisor as supervisor_module
from legato.orchestrator.display import LiveView
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.supervisor import Supervisor, start_session
from legato.paths import RunPaths

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


def test_a_finished_run_returns_only_once_its_job_has_ended(tmp_path: Path) -> None:
    """The job records the run's end, then runs on for three more looks (its tasks write their last files): the
    supervisor returns after the look that finds it ended, and records no job state after the run's last record."""
    code, fake, ledger = _supervise(_config(tmp_path), [running(), still("RUNNING", FINISHED), still(), still(), ended("COMPLETED")])
    assert code == EXIT_OK
    left = fake._steps["101"]
    assert len(left) == 1 and not left[0].active, f"returned with the job still running: {left}"
    assert ledger[-1]["event"] == "finished"


def test_a_job_that_never_ends_after_its_run_is_left_to_its_scheduler_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervisor_module, "JOB_END_WAIT_S", 0.05)
    code, fake, _ = _supervise(_config(tmp_path), [running(), still("RUNNING", FINISHED)])
    assert code == EXIT_OK and fake.cancelled == []
    assert "job 101 still runs 0 s after the run ended; leaving it to fake" in caplog.text


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
    "silent": {},
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


def _write_pace(run_dir: Path, job_id: str, slow_host: str) -> None:
    """Real pace files of attempt 1 of `job_id` (what each rank's Pace appends), rank 1 on `slow_host` slower at its forward."""
    for rank, (host, forward) in enumerate((("n1", 20.0), (slow_host, 35.0))):
        path = RunPaths(run_dir).pace(job_id, 1, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [{"step": 10 * i, "host": host, "forward_ms": forward, "data_ms": 1.0, "step_ms": 60.0} for i in range(3)]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_with_the_setting_a_resubmission_leaves_out_the_node_that_hung_and_a_slow_ranks_node(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "slurm.nodes=3", "slurm.tasks_per_node=1", "slurm.exclude_suspect_nodes=true")
    _write_pace(cfg.run_dir, "101", slow_host="n3")
    first = [running(0, ("n1", "n2", "n3"), {**HANG, "host": "n2"}), ended("FAILED")]
    code, fake, ledger = _supervise(cfg, first, [running(0, ("n1", "n4", "n5")), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK
    assert fake.submitted == [("101", ()), ("102", ("n2", "n3"))]
    (resubmitted,) = _events(ledger, "resubmitted")
    assert resubmitted["suspect_nodes"] == {
        "n2": "the job hung there at step 12",
        "n3": "rank 1 on n3 is slower: forward 35.0 ms against 20.0 ms for the others (+75%), in 3 of 3 windows",
    }
    assert "leaving out node n2: the job hung there at step 12" in (LiveView().event_line(resubmitted) or "")


def test_a_hang_whose_rank_on_another_node_never_answered_leaves_out_that_node_not_the_recorders(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "slurm.nodes=2", "slurm.tasks_per_node=1", "slurm.exclude_suspect_nodes=true")
    # Rank 0 found it on n1, waiting in a collective (not in its own code) for rank 1 on n2, which never answered.
    waited = {**HANG, "host": "n1", "frame": "torch/distributed/distributed_c10d.py:9 in all_reduce", "user_frame": None}
    first = [running(0, ("n1", "n2"), {**waited, "silent": {"1": "n2"}}), ended("FAILED")]
    code, fake, ledger = _supervise(cfg, first, [running(0, ("n1", "n3")), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK and fake.submitted == [("101", ()), ("102", ("n2",))]
    (resubmitted,) = _events(ledger, "resubmitted")
    assert resubmitted["suspect_nodes"] == {"n2": "rank 1 there never answered when the job hung at step 12"}


def test_a_rank_stuck_in_its_own_code_keeps_its_node_under_suspicion_beside_the_silent_ones(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "slurm.nodes=3", "slurm.tasks_per_node=1", "slurm.exclude_suspect_nodes=true")
    first = [running(0, ("n1", "n2", "n3"), {**HANG, "host": "n1", "silent": {"2": "n3"}}), ended("FAILED")]
    code, fake, ledger = _supervise(cfg, first, [running(0, ("n2", "n4", "n5")), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK and fake.submitted == [("101", ()), ("102", ("n1", "n3"))]


def test_suspects_stay_within_the_budget_and_are_kept_without_the_setting(tmp_path: Path) -> None:
    budget = _config(tmp_path / "a", "slurm.exclude_suspect_nodes=true", "slurm.max_suspect_nodes=1")
    hung_twice = [[running(0, ("n1",), {**HANG, "host": host}), ended("FAILED")] for host in ("n1", "n2")]
    code, fake, ledger = _supervise(budget, *hung_twice, [running(0, ("n3",)), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK and [exclude for _, exclude in fake.submitted] == [(), ("n1",), ("n1",)]
    assert [e["suspect_nodes"] for e in _events(ledger, "resubmitted")] == [{"n1": "the job hung there at step 12"}, {}]

    off = _config(tmp_path / "b")
    code, fake, ledger = _supervise(off, [running(0, ("n1",), HANG), ended("FAILED")], [running(0), ended("COMPLETED", FINISHED)])
    assert code == EXIT_OK and fake.submitted == [("101", ()), ("102", ())]
    assert _events(ledger, "resubmitted")[0]["suspect_nodes"] == {}
