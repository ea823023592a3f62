"""Multi-node rules that need no cluster, in one process: the start-up margin check, per-node environment
comparison, the master address and exclusion. The CLI's refusals: e2e/test_multinode_refusals.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import ROOT

from legato.config import load_config
from legato.errors import UsageError
from legato.orchestrator.status import summarize

SLURM_CONFIGS = sorted((ROOT / "configs").glob("tiny_gpt_*.yaml"))


@pytest.mark.parametrize("config", SLURM_CONFIGS, ids=lambda p: p.name)
def test_shipped_slurm_configs_leave_a_minute_to_start(config: Path) -> None:
    cfg = load_config(config)
    if cfg.executor == "slurm":
        assert cfg.slurm.time_min * 60 - cfg.slurm.signal_lead_s - 30 >= 60


def test_the_margin_is_exact_at_one_minute() -> None:
    assert load_config(None, ["executor=slurm", "slurm.time_min=2", "slurm.signal_lead_s=30"]).slurm.time_min == 2
    with pytest.raises(UsageError, match="leaves 59s"):
        load_config(None, ["executor=slurm", "slurm.time_min=2", "slurm.signal_lead_s=31"])
    # The local executor has no 30 s check: its limits are not SLURM's.
    assert load_config(None, ["executor=local", "slurm.time_min=1", "slurm.signal_lead_s=30"]).executor == "local"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _ledger(node1_env: str, node1_first: bool = False) -> list[dict]:
    """Two attempts of a 2-node job; node 1's capture of the second attempt is `node1_env`."""
    events = [{"event": "run_started", "time": 0.0, "total_steps": 10}]
    for restart, env in ((0, "A=1"), (1, node1_env)):
        tag = {"job_id": "7", "restart": restart, "time": float(restart)}
        started = {"event": "attempt_started", **tag, "hosts": ["n1", "n2"], "world_size": 2}
        node0 = {"event": "repro_captured", **tag, "node": 0, "sections": {"env": _digest("A=1"), "packages": _digest("p")}}
        node1 = {"event": "repro_captured", **tag, "node": 1, "sections": {"env": _digest(env), "packages": _digest("p")}}
        # Another node's capture may land before rank 0 records the attempt.
        events += [node1, started, node0] if node1_first else [started, node0, node1]
    return events


@pytest.mark.parametrize("node1_first", [False, True])
def test_status_compares_every_nodes_environment(tmp_path: Path, node1_first: bool) -> None:
    same = summarize(tmp_path, _ledger("A=1", node1_first))
    assert [a.environment_changed for a in same.attempts] == [None, []]
    changed = summarize(tmp_path, _ledger("A=2", node1_first))
    assert [a.environment_changed for a in changed.attempts] == [None, ["node1/env"]]


def test_an_attempt_slurm_requeued_by_itself_is_marked_ended(tmp_path: Path) -> None:
    started = [
        {"event": "attempt_started", "job_id": "7", "restart": r, "time": float(r), "hosts": ["n1", "n2"], "world_size": 2} for r in (0, 1)
    ]
    summary = summarize(tmp_path, [{"event": "run_started", "time": 0.0}, *started])
    assert [a.ended for a in summary.attempts] == ["ended, requeued by SLURM", "running"]


def test_master_address_is_the_first_node_unless_overridden() -> None:
    from legato.orchestrator.jobside import Identity

    ident = Identity("slurm", "12", 0, 1, 4, 1, 2, ("legato-n1", "legato-n2"))
    assert (ident.rank_env().master_addr, ident.rank_env().local_rank, ident.rank_env().local_world_size) == ("legato-n1", 1, 2)
    assert ident.rank_env("10.0.0.5").master_addr == "10.0.0.5"
    assert load_config(None, ["slurm.master_addr=10.0.0.5"]).slurm.master_addr == "10.0.0.5"


def test_exclusion_joins_the_users_own(tmp_path: Path) -> None:
    # The SLURM executor's parameters as plain data: no submitit SlurmExecutor, so no srun needed.
    from legato.slurm.submission import slurm_parameters

    cfg = load_config(None, ["executor=slurm", "slurm.extra_sbatch={exclude: bad1}"])
    parameters = slurm_parameters(cfg, ("n2", "bad1"))
    assert parameters["additional_parameters"]["exclude"] == "bad1,n2"
    plain = slurm_parameters(cfg, ())
    assert plain["additional_parameters"]["exclude"] == "bad1"


def test_resubmission_event_shows_the_excluded_nodes(tmp_path: Path) -> None:
    from legato.orchestrator.display import LiveView, status_table

    event = {
        "event": "resubmitted",
        "job_id": "9",
        "previous_job_id": "8",
        "reason": "FAILED",
        "failed_nodes": {"n1": "drained"},
        "excluded": ["n1"],
        "time": 1.0,
    }
    line = LiveView().event_line(event)
    assert "node n1 is drained" in line and "excluding n1" in line
    summary = summarize(tmp_path, [{"event": "run_started", "time": 0.0}, event])
    assert summary.excluded_nodes == ["n1"]
    assert "nodes excluded after they failed: n1" in status_table(summary)
