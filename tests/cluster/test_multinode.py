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
from conftest import ROOT, manifest
from helpers.cli import ledger, wait_for
from helpers.slurm_packages import install_both_clusters_packages

from legato.slurm.multinode import STATE_DIR, Node, client_env

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

TWO_NODE = ROOT / "configs" / "tiny_gpt_2node.yaml"
TWO_BY_TWO = ROOT / "configs" / "tiny_gpt_2x2.yaml"
FSDP2_GPT = ROOT / "configs" / "tiny_gpt_fsdp2.yaml"
NODES = 3  # 2-node jobs, and a spare node for the resubmission that excludes a failed one
# Few steps, a periodic checkpoint to fall back on, no time limit in sight: only the tests interrupt.
SHORT = ("train.steps=160", "checkpoint.every_steps=40", "checkpoint.hash_every_steps=20", "slurm.time_min=10")


def slurm_env() -> dict:
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
    already_up = (
        problem is None
        and legato("devcluster", "status", "--nodes").returncode == 0
        and f"legato-n{NODES} " in legato("devcluster", "status", "--nodes").stdout
    )
    if problem is None and not already_up:
        problem = install_both_clusters_packages()
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


class LocalReference:
    """An uninterrupted local run of the same training settings and threads, started now (it runs while a SLURM
    job waits on the scheduler) and read when a test needs its final hash."""

    def __init__(self, config: Path, run_dir: Path, nproc: int, *sets: str) -> None:
        cmd = [sys.executable, "-m", "legato", str(config), "--nproc", str(nproc), "--set", f"run.dir={run_dir}"]
        for item in (*SHORT, *sets):
            cmd += ["--set", item]
        self.run_dir = run_dir
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=slurm_env())

    def final_hash(self) -> str:
        try:
            _, err = self.proc.communicate(timeout=600)
        finally:
            self.proc.kill()
        assert self.proc.returncode == 0, err[-3000:]
        return manifest(self.run_dir)["global_hash"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> LocalReference:
    ref = LocalReference(TWO_NODE, tmp_path_factory.mktemp("reference"), 2)
    yield ref
    ref.proc.kill()


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


def test_two_nodes_stop_requeue_and_resume_bitwise(cluster, tmp_path: Path, reference: LocalReference) -> None:
    run_dir = tmp_path / "run"
    # The first node's address as an explicit rendezvous (by default it is the first node's name).
    # Slower steps (the bits are the same): on an idle machine the last 90 steps ran out before the stop arrived.
    proc = start(TWO_NODE, run_dir, f"slurm.master_addr={Node(1).address}", "chaos.step_sleep_s=0.05")
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
    assert [e["master_addr"] for e in events(run_dir, "attempt_started")] == [Node(1).address] * 2
    # Per-node truth: node 1 captured its own environment every attempt, and status compared it too.
    for restart in (0, 1):
        node1 = json.loads((run_dir / "repro" / job_id / str(restart) / "node1" / "manifest.json").read_text())
        assert node1["host"] == "legato-n2" and node1["labels"]["node"] == 1
    assert {e["node"] for e in events(run_dir, "repro_captured")} == {0, 1}
    assert second["environment_changed"] == []
    assert data["final_global_hash"] == reference.final_hash()


def test_killed_rank_on_a_failed_node_is_resubmitted_without_that_node(cluster, tmp_path: Path, reference: LocalReference) -> None:
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
    # Without slurm.master_addr the ranks meet on the job's first node, wherever the job landed.
    assert [e["master_addr"] for e in events(run_dir, "attempt_started")] == [first["hosts"][0], second["hosts"][0]]
    assert second["resumed_from_step"] >= newest and second["resumed_from_step"] % 40 == 0 and second["verified"] is True
    assert "excluding " + failed in out
    assert data["final_global_hash"] == reference.final_hash()


def test_a_rank_stopped_on_one_node_is_found_hung_and_the_job_resubmitted_without_that_node(
    cluster, tmp_path: Path, reference: LocalReference
) -> None:
    """A hang across nodes: rank 1 SIGSTOPped from outside, by pid, on its node. Rank 0's watchdog on the other node
    finds the hang (floor shortened to 5 s) but cannot reach rank 1's processes: the record names rank 1 silent on its
    node, the supervisor resubmits the hung job leaving that node out (slurm.exclude_suspect_nodes), and the run
    resumes verified on the spare node and ends on the bits of an uninterrupted local run."""
    run_dir = tmp_path / "run"
    proc = start(TWO_NODE, run_dir, "slurm.exclude_suspect_nodes=true", "hang.floor_s=5", "hang.phase_s=60")
    try:
        wait_for(lambda: any(e["step"] >= 40 for e in events(run_dir, "checkpoint_committed")), timeout=240, what="a checkpoint at step 40")
        hosts = {e["rank"]: e["host"] for e in events(run_dir, "rank_started")}
        rank1 = next(e for e in events(run_dir, "rank_started") if e["rank"] == 1)
        os.kill(rank1["pid"], signal.SIGSTOP)
        out = finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:]
    (hang,) = events(run_dir, "hang")
    assert hang["host"] == hosts[0] and hang["silent"] == {"1": hosts[1]}, hang
    assert f"no answer from rank 1 on {hosts[1]}" in out, out[-4000:]
    resubmitted = events(run_dir, "resubmitted")[0]
    assert resubmitted["excluded"] == [hosts[1]], resubmitted
    assert resubmitted["suspect_nodes"] == {hosts[1]: f"rank 1 there never answered when the job hung at step {hang['step']}"}
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["ended"].startswith("hung at step") and hosts[1] not in second["hosts"] and second["verified"] is True
    assert data["final_global_hash"] == reference.final_hash()


def test_killed_slurmd_fails_the_node_and_the_job_resumes_on_the_others(cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start(TWO_NODE, run_dir, "train.steps=1000000")  # never done: the test cancels it once the resume is verified
    victim = None
    try:
        wait_for(lambda: any(e["step"] >= 40 for e in events(run_dir, "checkpoint_committed")), timeout=240, what="a checkpoint at step 40")
        job_id = events(run_dir, "submitted")[0]["job_id"]
        victim = next(e["host"] for e in events(run_dir, "rank_started") if e["rank"] == 1)
        # The node's daemon dies, its job step does not: SLURM declares the node DOWN after SlurmdTimeout and the job NODE_FAIL.
        os.kill(int((STATE_DIR / "nodes" / victim / "slurmd.pid").read_text()), signal.SIGKILL)
        wait_for(lambda: events(run_dir, "resumed"), timeout=400, what="a resume on the other nodes")
        assert legato("cancel", str(run_dir)).returncode == 0
        out = finish(proc, timeout=300)
    finally:
        proc.kill()
        if victim:
            legato("devcluster", "up", "--nodes", str(NODES), timeout=900)  # brings the killed node back for what follows
    data = status(run_dir)
    first, second = data["attempts"][:2]
    assert first["job_id"] == job_id and victim in first["hosts"], out[-4000:]
    # SLURM requeued the job itself (NODE_FAIL of a requeueable job): the same job, restarted on the healthy nodes.
    assert second["job_id"] == job_id and second["restart"] == 1 and "requeued by SLURM" in first["ended"]
    assert victim not in second["hosts"] and len(second["hosts"]) == 2
    assert second["verified"] is True and second["resumed_from_step"] >= 40 and second["resumed_from_step"] % 40 == 0
    assert [e["match"] for e in events(run_dir, "resumed")][:1] == [True]


def test_two_by_two_resumes_bitwise_with_four_local_ranks(cluster, tmp_path: Path) -> None:
    # Rank 3 (on the second node) sends itself the real stop signal at step 25: a `scancel --signal` at an
    # observed step raced with a fast run that could finish first.
    sets = ("train.steps=60", "checkpoint.every_steps=20", "chaos.signal_rank=3", "chaos.signal_at_steps=[25]")
    run_dir = tmp_path / "run"
    proc = start(TWO_BY_TWO, run_dir, *sets)
    reference = LocalReference(TWO_BY_TWO, tmp_path / "reference", 4, *sets[:2])
    try:
        out = finish(proc)
        local_hash = reference.final_hash()
    finally:
        reference.proc.kill()
    assert proc.returncode == 0, out[-4000:]
    data = status(run_dir)
    hosts = {e["rank"]: e["host"] for e in events(run_dir, "rank_started") if e["restart"] == 0}
    assert hosts == {0: "legato-n1", 1: "legato-n1", 2: "legato-n2", 3: "legato-n2"}
    assert len(data["attempts"]) == 2 and data["all_resumes_verified"]
    assert data["attempts"][0]["stop_signal_step"] is not None and data["attempts"][1]["resumed_from_step"] >= 25
    assert data["final_global_hash"] == local_hash


def test_fsdp2_on_two_nodes_stops_requeues_and_resumes_bitwise(cluster, tmp_path: Path) -> None:
    """configs/tiny_gpt_fsdp2.yaml sharded over two nodes, one rank each (the device mesh spans the namespaces, gloo
    crosses the virtual links): the stop signal from outside at step 8 or later, requeue, a replay-verified resume, and
    the bits of an uninterrupted local run at the same world size. Steps are slowed (bits unchanged) so the signal
    lands mid-run."""
    fsdp2 = (
        "train.steps=30",
        "checkpoint.every_steps=10",
        "checkpoint.hash_every_steps=5",
        "chaos.signal_at_steps=[]",
        "determinism.threads=1",
    )
    run_dir = tmp_path / "run"
    proc = start(FSDP2_GPT, run_dir, *fsdp2, "executor=slurm", "slurm.nodes=2", "slurm.tasks_per_node=1", "chaos.step_sleep_s=0.5")
    reference = None
    try:
        wait_for(lambda: step_reached(run_dir, 8), timeout=240, what="step 8")
        job_id = events(run_dir, "submitted")[0]["job_id"]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True, env=slurm_env())
        reference = LocalReference(FSDP2_GPT, tmp_path / "reference", 2, *fsdp2)
        out = finish(proc)
        local_hash = reference.final_hash()
    finally:
        proc.kill()
        if reference:
            reference.proc.kill()
    assert proc.returncode == 0, out[-4000:]
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["job_id"] == second["job_id"] == job_id and first["ended"] == "requeued"
    assert second["verified"] is True and second["resumed_from_step"] >= 8 and data["all_resumes_verified"]
    ranks = {e["rank"]: e["host"] for e in events(run_dir, "rank_started") if e["restart"] == 0}
    assert ranks == {0: "legato-n1", 1: "legato-n2"}
    # Each node wrote its own rank's shards into the one shared checkpoint.
    assert {"model.shard0.pt", "model.shard1.pt", "optimizer.shard0.pt", "optimizer.shard1.pt"} <= set(manifest(run_dir)["files"])
    assert data["final_global_hash"] == local_hash
