"""The whole cycle across nodes on a real multi-node SLURM (`legato devcluster up --nodes 3`): every node its own
network namespace, hostname, /etc/hosts and munged; gloo traffic crosses the virtual links.

One cluster serves the module. Skipped with the reason where it cannot start (not root, no apt-get, no network
namespaces), except under CI=true, where it must start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, manifest, run_trainer
from test_supervisor import ledger, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

TWO_NODE = ROOT / "configs" / "tiny_gpt_2node.yaml"
TWO_BY_TWO = ROOT / "configs" / "tiny_gpt_2x2.yaml"
NODES = 3  # 2-node jobs, and a spare node for the resubmission that excludes a failed one
# Few steps, a periodic checkpoint to fall back on, no time limit in sight: only the tests interrupt.
SHORT = ("train.steps=160", "checkpoint.every_steps=40", "checkpoint.hash_every_steps=20", "slurm.time_min=10")


def slurm_env() -> dict:
    from legato.slurm.multinode import client_env

    return client_env(dict(os.environ, PYTHONWARNINGS="ignore"))


def legato(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=slurm_env())


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, env=slurm_env(), check=True).stdout


@pytest.fixture(scope="module")
def cluster() -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "not root"
    elif not shutil.which("apt-get") and not shutil.which("slurmd"):
        problem = "no apt-get to install SLURM"
    elif not shutil.which("ip") or not shutil.which("nsenter"):
        problem = "no iproute2/util-linux for network namespaces"
    already_up = problem is None and legato("devcluster", "status", "--nodes").returncode == 0 and f"legato-n{NODES} " in legato("devcluster", "status", "--nodes").stdout
    if problem is None and not already_up:
        proc = legato("devcluster", "up", "--nodes", str(NODES), timeout=900)
        if proc.returncode != 0:
            problem = f"`legato devcluster up --nodes {NODES}` failed: {proc.stdout[-1500:]} {proc.stderr[-1500:]}"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the multi-node SLURM cluster must start under CI=true: {problem}")
        pytest.skip(f"no multi-node SLURM cluster: {problem}")
    yield
    if not already_up:
        legato("devcluster", "down", "--nodes")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Final global hash of an uninterrupted local 2-rank run of the same training settings and threads."""
    ref = tmp_path_factory.mktemp("reference")
    proc = run_trainer(TWO_NODE, ref, *SHORT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return manifest(ref)["global_hash"]


def start(config: Path, run_dir: Path, *sets: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", "run", str(config), "--set", f"run.dir={run_dir}"]
    for item in (*SHORT, *sets):
        cmd += ["--set", item]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=slurm_env())


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def status(run_dir: Path) -> dict:
    proc = legato("status", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def step_reached(run_dir: Path, step: int) -> bool:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"] >= step
    except (OSError, ValueError, KeyError):
        return False


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in ledger(run_dir) if e["event"] == kind] if (run_dir / "ledger.jsonl").exists() else []


def test_two_nodes_stop_requeue_and_resume_bitwise(cluster, tmp_path: Path, reference: str) -> None:
    run_dir = tmp_path / "run"
    proc = start(TWO_NODE, run_dir)
    wait_for(lambda: step_reached(run_dir, 70), timeout=240, what="step 70")
    job_id = events(run_dir, "submitted")[0]["job_id"]
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, env=slurm_env())  # what the time limit sends, now
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["job_id"] == second["job_id"] == job_id and [first["restart"], second["restart"]] == [0, 1]
    assert first["ended"] == "requeued" and second["verified"] is True and second["resumed_from_step"] >= 70
    # One rank on each node, each in its own namespace under its own name, both reached by the stop signal.
    ranks = {e["rank"]: e["host"] for e in events(run_dir, "rank_started") if e["restart"] == 0}
    assert ranks == {0: "legato-n1", 1: "legato-n2"} and first["hosts"] == ["legato-n1", "legato-n2"]
    assert {e["rank"] for e in events(run_dir, "stop_signal")} == {0, 1}
    assert [e["master_addr"] for e in events(run_dir, "attempt_started")] == ["legato-n1", "legato-n1"]
    # Per-node truth: node 1 captured its own environment every attempt, and status compared it too.
    for restart in (0, 1):
        node1 = json.loads((run_dir / "repro" / job_id / str(restart) / "node1" / "manifest.json").read_text())
        assert node1["host"] == "legato-n2" and node1["labels"]["node"] == 1
    assert {e["node"] for e in events(run_dir, "repro_captured")} == {0, 1}
    assert second["environment_changed"] == []
    assert data["final_global_hash"] == reference


def test_killed_rank_on_a_failed_node_is_resubmitted_without_that_node(cluster, tmp_path: Path, reference: str) -> None:
    run_dir = tmp_path / "run"
    proc = start(TWO_NODE, run_dir)
    failed = None
    try:
        wait_for(lambda: any(e["step"] >= 40 for e in events(run_dir, "checkpoint_committed")), timeout=240, what="a checkpoint at step 40")
        job_id = events(run_dir, "submitted")[0]["job_id"]
        rank0 = next(e for e in events(run_dir, "rank_started") if e["rank"] == 0)
        failed = rank0["host"]
        # A health check drains the node, then its rank dies (as on a GPU fault): no stop signal, no requeue.
        scontrol("update", f"NodeName={failed}", "State=DRAIN", "Reason=legato-test")
        newest = max(e["step"] for e in events(run_dir, "checkpoint_committed"))
        os.kill(rank0["pid"], signal.SIGKILL)
        out = finish(proc)
    finally:
        proc.kill()
        if failed:
            scontrol("update", f"NodeName={failed}", "State=RESUME")
    assert proc.returncode == 0, out[-4000:]
    resubmitted = events(run_dir, "resubmitted")[0]
    assert resubmitted["previous_job_id"] == job_id and resubmitted["excluded"] == [failed]
    assert resubmitted["failed_nodes"][failed].startswith("drain")
    assert f"ExcNodeList={failed}" in scontrol("show", "job", resubmitted["job_id"])
    data = status(run_dir)
    first, second = data["attempts"]
    assert data["resubmissions"] == 1 and data["excluded_nodes"] == [failed]
    assert failed not in second["hosts"] and len(second["hosts"]) == 2
    assert second["resumed_from_step"] >= newest and second["resumed_from_step"] % 40 == 0 and second["verified"] is True
    assert "excluding " + failed in out
    assert data["final_global_hash"] == reference


def test_master_address_override_is_where_the_ranks_meet(cluster, tmp_path: Path) -> None:
    from legato.slurm.multinode import Node

    run_dir = tmp_path / "run"
    first_node_ip = Node(1).address
    sets = ("train.steps=20", "checkpoint.every_steps=0", f"slurm.master_addr={first_node_ip}")
    proc = legato("run", str(TWO_NODE), "--set", f"run.dir={run_dir}", *(f"--set={s}" for s in (*SHORT, *sets)))
    assert proc.returncode == 0, proc.stdout[-3000:]
    started = events(run_dir, "attempt_started")
    assert [e["master_addr"] for e in started] == [first_node_ip] and started[0]["hosts"][0] == "legato-n1"
