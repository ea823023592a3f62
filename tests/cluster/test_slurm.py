"""The whole cycle on a real SLURM (slurm-wlm started by `legato devcluster up`): time-limit signal,
`scontrol requeue`, restart counts, sacct states, preemption, hard kill, requeue budget, and the FSDP2 config
(sharded state) through a preemption.

Skipped with the reason where the cluster cannot start (not root, no apt-get), except under CI=true.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, manifest, run_trainer
from helpers.cli import ledger, legato, status, wait_for
from helpers.launches import reaped, start_ranks, stderr_tails, steps_done
from helpers.port import PORT, UNSEEDED, assert_same_run, launch, torchrun_reference
from helpers.shared_runs import SharedRuns
from helpers.slurm_packages import install_both_clusters_packages

from legato.runtime.launch import free_port
from legato.system.processes import children

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SLURM_GPT = ROOT / "configs" / "tiny_gpt_slurm.yaml"
# No time limit in sight (only the test interrupts), and steps past the third periodic checkpoint: an interruption after
# the first still leaves most of the run to resume.
EVERY = 125
SHORT = ("train.steps=400", f"checkpoint.every_steps={EVERY}", "slurm.time_min=10")
FSDP2_GPT = ROOT / "configs" / "tiny_gpt_fsdp2.yaml"
# The FSDP2 config's training as it stands (bfloat16 parameters, 2 micro-batches, activation checkpointing), in few
# steps with a periodic checkpoint, one torch thread per rank on both sides of the comparison, no planted stops.
FSDP2_SHORT = ("train.steps=30", "checkpoint.every_steps=10", "chaos.signal_at_steps=[]", "determinism.threads=1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "not root"
    elif not shutil.which("apt-get") and not shutil.which("slurmctld"):
        problem = "no apt-get to install SLURM"
    already_up = problem is None and legato("devcluster", "status").returncode == 0
    if problem is None and not already_up:
        problem = install_both_clusters_packages()
    if problem is None and not already_up:
        # From a private TMPDIR (0700, as a SLURM job's own often is): the daemons, MariaDB's mysql user among them,
        # must not inherit it.
        proc = legato("devcluster", "up", timeout=900, TMPDIR=str(tmp_path_factory.mktemp("private-tmp")))
        if proc.returncode != 0:
            problem = f"`legato devcluster up` failed: {proc.stdout[-1500:]} {proc.stderr[-1500:]}"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SLURM cluster must start under CI=true: {problem}")
        pytest.skip(f"no local SLURM cluster: {problem}")
    yield
    if not already_up:
        legato("devcluster", "down")


def reference(tmp_path_factory: pytest.TempPathFactory, *sets: str) -> str:
    """Final global hash of an uninterrupted local run of the same training settings."""
    ref = tmp_path_factory.mktemp("reference")
    proc = run_trainer(SLURM_GPT, ref, *sets, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return manifest(ref)["global_hash"]


@pytest.fixture(scope="module")
def short_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return reference(tmp_path_factory, *SHORT)


def start(run_dir: Path, *sets: str, config: Path = SLURM_GPT) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", "run", str(config), "--set", f"run.dir={run_dir}"]
    for item in sets:
        cmd += ["--set", item]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore")
    )


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def step_reached(run_dir: Path, step: int) -> bool:
    try:
        return json.loads((run_dir / "progress.json").read_text())["step"] >= step
    except (OSError, ValueError, KeyError):
        return False


def sacct_history(job_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-o", "State"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_time_limit_requeues_one_job_until_done(cluster, tmp_path: Path, short_reference: str) -> None:
    run_dir = tmp_path / "run"
    # A two-minute limit: the signal comes 60 to 90 s into each attempt. Sleeping 250 ms a step makes SHORT's 400 steps
    # (100 s of sleep alone) outlast one attempt on any machine, and a loaded one needs three or four. SHORT's reference
    # is this training (its time limit is the scheduler's, not the training's).
    sets = [arg for item in SHORT[:2] for arg in ("--set", item)]
    proc = legato("run", str(SLURM_GPT), "--set", f"run.dir={run_dir}", *sets, "--set", "chaos.step_sleep_s=0.25", timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = status(run_dir)
    attempts = data["attempts"]
    assert len(attempts) >= 2
    assert len({a["job_id"] for a in attempts}) == 1 and data["resubmissions"] == 0
    assert [a["restart"] for a in attempts] == list(range(len(attempts)))
    assert all(a["verified"] for a in attempts[1:]) and data["all_resumes_verified"]
    assert all(a["ended"] == "requeued" for a in attempts[:-1])
    events = ledger(run_dir)
    job_id = attempts[0]["job_id"]
    assert "REQUEUED" in sacct_history(job_id) or any(e["event"] == "job_state" and e["state"] == "REQUEUED" for e in events)
    # The time-limit signal reaches every task of the job, not only rank 0.
    assert {e["rank"] for e in events if e["event"] == "stop_signal"} == {0, 1}
    assert data["final_global_hash"] == short_reference


def test_preemption_signal_at_an_arbitrary_moment(cluster, tmp_path: Path, short_reference: str) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *SHORT)
    at = random.Random(os.getpid()).randrange(25, 200)
    wait_for(
        lambda: (json.loads((run_dir / "progress.json").read_text())["step"] >= at) if (run_dir / "progress.json").exists() else False,
        timeout=180,
        what=f"step {at}",
    )
    job_id = [e for e in ledger(run_dir) if e["event"] == "submitted"][0]["job_id"]
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["job_id"] == second["job_id"] == job_id and [first["restart"], second["restart"]] == [0, 1]
    assert first["ended"] == "requeued" and second["verified"] is True and second["resumed_from_step"] >= at
    assert data["final_global_hash"] == short_reference


def test_fsdp2_config_is_preempted_requeued_and_resumes_bitwise(cluster, tmp_path: Path, tmp_path_factory) -> None:
    """configs/tiny_gpt_fsdp2.yaml on the SLURM backend (2 tasks on the node, each writing its own shards): the
    preemption signal from outside at step 8 or later, `scontrol requeue`, and the requeued job resumes replay-verified
    and ends on the bits of an uninterrupted local run. Steps are slowed (bits unchanged) so the signal lands mid-run."""
    run_dir, ref = tmp_path / "run", tmp_path_factory.mktemp("reference")
    on_slurm = ("executor=slurm", "slurm.tasks_per_node=2", "slurm.time_min=10", "chaos.step_sleep_s=0.5")
    proc = start(run_dir, *FSDP2_SHORT, *on_slurm, config=FSDP2_GPT)
    try:
        wait_for(lambda: step_reached(run_dir, 8), timeout=240, what="step 8")
        job_id = [e for e in ledger(run_dir) if e["event"] == "submitted"][0]["job_id"]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        reference = run_trainer(FSDP2_GPT, ref, *FSDP2_SHORT, timeout=600)
        out = finish(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert reference.returncode == 0, reference.stderr[-3000:]
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["job_id"] == second["job_id"] == job_id and [first["restart"], second["restart"]] == [0, 1]
    assert first["ended"] == "requeued" and second["verified"] is True and second["resumed_from_step"] >= 8
    assert data["all_resumes_verified"]
    final = manifest(run_dir)
    assert {"model.shard0.pt", "model.shard1.pt", "optimizer.shard0.pt", "optimizer.shard1.pt"} <= set(final["files"])
    assert data["final_global_hash"] == final["global_hash"] == manifest(ref)["global_hash"]


def test_hard_kill_is_resubmitted_from_the_last_periodic_checkpoint(cluster, tmp_path: Path, short_reference: str) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, *SHORT)
    wait_for(
        lambda: (run_dir / "ledger.jsonl").exists() and any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)),
        timeout=180,
        what="a periodic checkpoint",
    )
    job_id = [e for e in ledger(run_dir) if e["event"] == "submitted"][0]["job_id"]
    subprocess.run(["scancel", job_id], check=True)  # no warning signal
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "without requeuing itself; resubmitted" in out
    data = status(run_dir)
    first, second = data["attempts"]
    assert second["job_id"] != job_id and data["resubmissions"] == 1 and "CANCELLED" in first["ended"]
    assert second["resumed_from_step"] % EVERY == 0 and second["resumed_from_step"] >= EVERY and second["verified"] is True
    assert data["final_global_hash"] == short_reference


def test_a_rank_stopped_under_srun_is_found_hung_and_the_job_resubmitted(cluster, tmp_path: Path, short_reference: str) -> None:
    """srun ends a step only when every task has ended: the watchdog of the waiting rank ends the stopped one too."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *SHORT, "hang.floor_s=5", "hang.phase_s=60")
    wait_for(
        lambda: (run_dir / "ledger.jsonl").exists() and any(e["event"] == "checkpoint_committed" for e in ledger(run_dir)),
        timeout=180,
        what="a periodic checkpoint",
    )
    rank1 = next(e["pid"] for e in ledger(run_dir) if e["event"] == "rank_started" and e["rank"] == 1)
    os.kill(rank1, signal.SIGSTOP)
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "hung at step" in out and "resubmitted as job" in out, out[-4000:]
    (hang,) = [e for e in ledger(run_dir) if e["event"] == "hang"]
    assert "rank 1" in hang["stopped"] and (run_dir / hang["stacks"] / "rank1.txt").is_file(), hang
    data = status(run_dir)
    first, second = data["attempts"]
    assert first["ended"].startswith("hung at step") and second["verified"] is True and data["resubmissions"] == 1
    assert data["final_global_hash"] == short_reference


def test_requeue_budget_ends_a_job_that_keeps_stopping(cluster, tmp_path: Path) -> None:
    """Two real stop signals (rank 1 signals itself after steps 5 and 10) against a budget of one requeue: the first
    stop requeues the job through SLURM, the second ends the run with the reason. The time-limit path to the same
    budget rule is test_time_limit_requeues_one_job_until_done's; stops by signal keep this one short."""
    run_dir = tmp_path / "run"
    sets = (
        "slurm.max_requeues=1",
        "train.steps=400",
        "checkpoint.agree_every_steps=1",
        "chaos.signal_rank=1",
        "chaos.signal_at_steps=[5, 10]",
    )
    proc = legato("run", str(SLURM_GPT), "--set", f"run.dir={run_dir}", *(a for item in sets for a in ("--set", item)), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    data = status(run_dir)
    assert data["state"] == "failed" and len(data["attempts"]) == 2
    assert "requeue budget exhausted" in data["failure"]
    table = legato("status", str(run_dir)).stdout
    assert "requeue budget exhausted" in table


def test_a_job_slurm_can_never_start_ends_the_run_at_once(cluster, tmp_path: Path) -> None:
    """Two nodes asked of the one-node partition: SLURM keeps the job PENDING forever (PartitionNodeLimit, or
    PartitionConfig on SLURM 22.05). `legato run` ends with exit 1, the reason and the fix, and the job cancelled."""
    run_dir = tmp_path / "run"
    proc = legato("run", str(SLURM_GPT), "--set", f"run.dir={run_dir}", "--set", "slurm.nodes=2", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert "can never start: slurm keeps it pending with reason" in out and "Lower slurm.nodes to 1 or less" in out, out[-3000:]
    events = ledger(run_dir)
    reasons = [e["reason"] for e in events if e["event"] == "pending_reason"]
    assert reasons and reasons[-1] in ("PartitionNodeLimit", "PartitionConfig"), reasons
    (failed,) = [e for e in events if e["event"] == "failed"]
    job_id = failed["job_id"]
    assert reasons[-1] in failed["reason"] and f"Job {job_id} was cancelled" in failed["reason"]
    wait_for(lambda: "CANCELLED" in sacct_history(job_id), timeout=60, what=f"sacct to show job {job_id} cancelled")
    assert subprocess.run(["squeue", "-h", "-j", job_id, "-t", "PENDING"], capture_output=True, text=True).stdout.strip() == ""
    data = status(run_dir)
    assert data["state"] == "failed" and "Lower slurm.nodes" in data["failure"] and data["waiting"] is None


def test_job_state_without_accounting_falls_back_and_never_stays_unknown(cluster) -> None:
    from legato.slurm.backends import backend_for
    from legato.slurm.jobs import JobHandle

    assert legato("devcluster", "up", "--no-accounting", timeout=300).returncode == 0
    try:
        assert subprocess.run(["sacct", "-n"], capture_output=True).returncode != 0, "accounting should be off"
        job_id = subprocess.run(
            ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 4"], capture_output=True, text=True, check=True
        ).stdout.strip()
        handle = JobHandle(backend_for("slurm"), job_id)
        assert handle.state().active
        wait_for(lambda: not handle.state().active, timeout=60, what="the job to end")
        assert handle.state().name == "COMPLETED"
        gone = JobHandle(backend_for("slurm"), "987654", unknown_grace_s=0.0)
        assert gone.state().name == "UNKNOWN" and not gone.state().active
    finally:
        assert legato("devcluster", "up", timeout=300).returncode == 0
    assert subprocess.run(["sacct", "-n"], capture_output=True).returncode == 0


SRUN_JOB = """#!/bin/bash
#SBATCH --job-name=legato-srun --nodes=1 --ntasks=2 --cpus-per-task=1 --requeue --open-mode=append
#SBATCH --output={out} --chdir={root}
# One srun step per attempt: each task is one rank, its rank from what srun sets; exit 75 from every rank is
# "stopped at a checkpoint, requeue me".
export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} PYTHONWARNINGS=ignore LEGATO_CHAOS_SIGNAL_AT=7 LEGATO_CHAOS_SIGNAL_RANK=1
srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID exec "$@"' rank {python} {script} {run_dir}
rc=$?
echo "attempt ${{SLURM_RESTART_COUNT:-0}} exited $rc"
exec {python} -m legato.orchestrator.cli requeue {run_dir} --exit-code $rc
"""


def submit(template: str, tmp_path: Path, script: Path) -> str:
    """sbatch a job script made from `template` for `script` (run directory tmp_path/run, output tmp_path/slurm.out,
    every value shell-quoted); returns the job id."""
    (tmp_path / "run").mkdir()
    values = {"out": tmp_path / "slurm.out", "root": ROOT, "python": sys.executable, "script": script, "run_dir": tmp_path / "run"}
    job = tmp_path / "job.sh"
    job.write_text(template.format(port=free_port(), **{k: shlex.quote(str(v)) for k, v in values.items()}))
    return subprocess.run(["sbatch", "--parsable", str(job)], capture_output=True, text=True, check=True).stdout.strip()


def test_srun_runs_a_user_script_that_stops_requeues_and_resumes_exactly(cluster, tmp_path: Path) -> None:
    """The ported nanoGPT loop under `srun` (2 tasks, one node), its own sbatch script: a real SIGUSR2 after step 7
    (planted, the rank sends it to itself), exit 75 from both ranks, `legato requeue` (the attempt committed its stop
    checkpoint: progress), the second run of the same job resumes at step 8 and ends bit for bit where a run without a
    stop ends."""
    run_dir, out = tmp_path / "run", tmp_path / "slurm.out"
    job_id = submit(SRUN_JOB, tmp_path, PORT / "nanogpt_legato.py")
    try:
        reference = tmp_path / "reference"
        assert [p.returncode for p in launch(PORT / "nanogpt_legato.py", reference)] == [0, 0]
        show = _wait_finished(job_id, timeout=240)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    log = out.read_text()
    assert "JobState=COMPLETED" in show and "Restarts=1" in show, show + log[-3000:]
    assert "attempt 0 exited 75" in log and "attempt 1 exited 0" in log, log[-3000:]
    assert "stopped at the checkpoint of step 8: requeued" in log and "the launch exited 0" in log, log[-3000:]
    resumed = [line for line in log.splitlines() if line.startswith("legato: rank 0: resumed at step")]
    assert len(resumed) == 1 and resumed[0].startswith("legato: rank 0: resumed at step 8 ") and "verified" in resumed[0], log[-3000:]
    assert_same_run(reference, run_dir, 25, UNSEEDED)


# A start-up (65 s) longer than the signal's lead allows: SLURM's time-limit signal (checked every 30 s, sent 20 to 50 s
# into the job) reaches the launcher and the ranks, or on a busy machine the launcher alone while torchrun still starts
# them (it holds the stop and sends it as they appear); their Sessions stop before a first step and exit 75, about 80 s
# into the 2-minute limit on an idle machine.
SLOW_START_JOB = """#!/bin/bash
#SBATCH --job-name=legato-slow-start --nodes=1 --ntasks=1 --cpus-per-task=2 --requeue --open-mode=append
#SBATCH --time=2 --signal=USR2@100 --output={out} --chdir={root}
export PYTHONWARNINGS=ignore START_DELAY_S=65
srun {python} -m legato.torchrun --max-restarts 0 --nproc-per-node 2 --master-port {port} {script} {run_dir}
rc=$?
echo "attempt ${{SLURM_RESTART_COUNT:-0}} exited $rc"
exec {python} -m legato.orchestrator.cli requeue {run_dir} --exit-code $rc
"""


def test_a_start_up_longer_than_the_signal_lead_ends_the_job_instead_of_requeuing_it_for_ever(cluster, tmp_path: Path) -> None:
    """Exit 75 with no checkpoint committed: `legato requeue` ends the job naming why and the fix, where the plain
    `scontrol requeue` pattern would requeue it for ever (every attempt stopping the same way)."""
    run_dir, out = tmp_path / "run", tmp_path / "slurm.out"
    job_id = submit(SLOW_START_JOB, tmp_path, ROOT / "tests" / "helpers" / "hang_loop.py")
    try:
        show = _wait_finished(job_id, timeout=300)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    log = out.read_text()
    assert "JobState=FAILED" in show and "Restarts=0" in show, show + log[-3000:]
    assert "attempt 0 exited 75" in log and "would stop the same way, for ever" in log, log[-3000:]
    summary = status(run_dir)
    assert summary["state"] == "failed" and "--signal=USR2@" in summary["failure"], summary


def _wait_finished(job_id: str, timeout: float) -> str:
    """`scontrol show job` once the job has ended for good (a requeued job passes through PENDING again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
        if any(f"JobState={state}" in show for state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")):
            return show
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s: {show}")


# The scheduler's own time-limit signal, no planted stop. SLURM checks time limits only every 30 s and may send the
# signal early: with --time=2 and --signal=...@60 it once came about 40 s into an attempt, before a suite-loaded machine had
# started the ranks (the attempt then rightly ends the job: it committed nothing). --time=3 sends it 100 to 150 s in,
# leaving the first attempt time to start and train, and the second time to finish before its own signal. The first
# attempt's steps are slowed from outside (7 s a step, bits unchanged) so that 25 steps outlast the signal; the
# requeued attempt runs at full speed.
SIGNAL_JOB_HEAD = """#!/bin/bash
#SBATCH --job-name=legato-signal --nodes=1 --ntasks=1 --cpus-per-task=2 --requeue --open-mode=append
#SBATCH --time=3 --signal={signal}@60 --output={out} --chdir={root}
export PYTHONWARNINGS=ignore
attempt=${{SLURM_RESTART_COUNT:-0}}
if [ "$attempt" = 0 ]; then export LEGATO_CHAOS_STEP_SLEEP_S=7; fi
launch=({python} -m legato.torchrun --max-restarts 0 --nproc-per-node 2 --master-port {port} {script} {run_dir})
requeue=({python} -m legato.orchestrator.cli requeue {run_dir})
"""
# Without B: SLURM signals every process of each srun step (the launcher, the ranks, their workers), never the batch
# shell: the launcher forwards the stop to the ranks once more, which changes nothing.
SRUN_STEP = """srun "${launch[@]}"
rc=$?
"""
# With B: SLURM signals the batch shell alone, and bash does not pass a signal on to its children: the job script
# traps it and forwards it to the launcher, which it runs in the background so that `wait` returns when the trap fires;
# it then waits again (bash keeps a finished job's status for `wait`) until a wait was not cut short by the trap.
BATCH_SHELL = """"${launch[@]}" &
launcher=$!
trap 'forwarded=1; echo "batch shell: USR2, forwarded to the launcher"; kill -USR2 $launcher' USR2
while :; do forwarded=0; wait $launcher; rc=$?; [ $forwarded = 1 ] || break; done
"""
REQUEUE = """echo "attempt $attempt exited $rc"
exec "${requeue[@]}" --exit-code $rc
"""


@pytest.mark.parametrize(("signal_option", "body"), [("USR2", SRUN_STEP), ("B:USR2", BATCH_SHELL)], ids=["srun-step", "batch-shell"])
def test_slurms_own_time_limit_signal_stops_a_launcher_job_that_requeues_and_resumes_exactly(
    cluster, shared_runs: SharedRuns, tmp_path: Path, signal_option: str, body: str
) -> None:
    """`python -m legato.torchrun` (2 ranks) in a user's sbatch script with the relaunch pattern: SLURM's
    `--signal=USR2@60` (every process of the srun step) or `--signal=B:USR2@60` (the batch shell, whose trap forwards
    it) stops the job at an agreed, committed checkpoint; exit 75, `scontrol requeue`, and the requeued job resumes
    verified and ends bit for bit where an uninterrupted launch ends."""
    # The reference trains before the job is submitted, so that the job's start-up does not share the cores with it.
    reference = torchrun_reference(shared_runs)
    run_dir, out = tmp_path / "run", tmp_path / "slurm.out"
    values = {"out": out, "root": ROOT, "python": sys.executable, "script": PORT / "nanogpt_legato.py", "run_dir": run_dir}
    script = tmp_path / "job.sh"
    head = SIGNAL_JOB_HEAD.format(signal=signal_option, port=free_port(), **{k: shlex.quote(str(v)) for k, v in values.items()})
    script.write_text(head + body + REQUEUE)
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True).stdout.strip()
    try:
        show = _wait_finished(job_id, timeout=480)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    log = out.read_text()
    assert "JobState=COMPLETED" in show and "Restarts=0" not in show, show + log[-3000:]
    attempts = [line for line in log.splitlines() if line.startswith("attempt ")]
    assert attempts[0] == "attempt 0 exited 75" and attempts[-1] == f"attempt {len(attempts) - 1} exited 0", log[-3000:]
    assert "USR2 reached the launcher" in log and "every rank stopped at a committed checkpoint (exit 75)" in log, log[-3000:]
    if signal_option.startswith("B:"):
        assert "batch shell: USR2, forwarded to the launcher" in log, log[-3000:]
    else:
        assert "batch shell: USR2" not in log
    assert "Traceback" not in log, log[-3000:]
    resumed = [line for line in log.splitlines() if line.startswith("legato: rank 0: resumed at step")]
    assert resumed and all("verified" in line for line in resumed), log[-3000:]
    assert_same_run(reference, run_dir, 25, UNSEEDED)


# A job script shaped like the README's, preempted as a production cluster preempts (PreemptMode=REQUEUE, GraceTime on
# the partition): an exclusive job submitted to the devcluster's `urgent` partition needs the node, so slurmctld sends SIGCONT and
# SIGTERM to every task of the running job's srun step (the launcher, the ranks, their workers; not srun, not the batch
# shell) and gives it GraceTime before it ends and requeues it. The first attempt's steps are slowed from outside
# (4 s a step, bits unchanged) so that the preemption finds it training.
PREEMPTED_JOB = """#!/bin/bash
#SBATCH --job-name=legato-preempted --nodes=1 --ntasks=1 --cpus-per-task=2 --requeue --open-mode=append
#SBATCH --output={out} --chdir={root}
export PYTHONWARNINGS=ignore
[ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && export LEGATO_RESUME=required || export LEGATO_CHAOS_STEP_SLEEP_S=4
trap 'echo "batch shell: SIGTERM (preemption); the ranks checkpoint first"' TERM
srun {python} -m legato.torchrun --max-restarts 0 --nproc-per-node 2 --master-port {port} {script} {run_dir}
rc=$?
echo "attempt ${{SLURM_RESTART_COUNT:-0}} exited $rc"
exec {python} -m legato.orchestrator.cli requeue {run_dir} --exit-code $rc
"""


def test_preemption_by_a_higher_priority_job_stops_at_a_checkpoint_and_the_job_resumes_exactly(cluster, tmp_path: Path) -> None:
    """SIGTERM as preemption sends it, from slurmctld: the launcher takes the SIGTERM its step's tasks get and sends
    the ranks their stop signal, every rank stops at one agreed, committed checkpoint within the grace time (exit 75),
    `legato requeue` requeues the job, the urgent job runs on the freed node, and the requeued job resumes verified
    and ends bit for bit where an uninterrupted launch ends."""
    run_dir, out, reference = tmp_path / "run", tmp_path / "slurm.out", tmp_path / "reference"
    if subprocess.run(["scontrol", "show", "partition", "urgent"], capture_output=True).returncode != 0:
        pytest.fail("the running devcluster has no `urgent` partition (an older legato started it): `legato devcluster up`")
    # The reference first: nothing else competes for the cores while the preempted ranks checkpoint within the grace.
    assert [p.returncode for p in launch(PORT / "nanogpt_legato.py", reference)] == [0, 0]
    job_id = submit(PREEMPTED_JOB, tmp_path, PORT / "nanogpt_legato.py")
    urgent = None
    try:
        wait_for(lambda: step_reached(run_dir, 2), timeout=240, what="the first attempt's step 2")
        urgent = subprocess.run(
            ["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-o", str(tmp_path / "urgent.out"), "--wrap", "echo urgent job ran"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        show = _wait_finished(job_id, timeout=420)
        urgent_show = _wait_finished(urgent, timeout=60)
    finally:
        subprocess.run(["scancel", job_id, *([urgent] if urgent else [])], capture_output=True)
    log = out.read_text()
    assert "JobState=COMPLETED" in urgent_show and "urgent job ran" in (tmp_path / "urgent.out").read_text(), urgent_show
    assert "JobState=COMPLETED" in show and "Restarts=0" not in show, show + log[-3000:]
    attempts = [line for line in log.splitlines() if line.startswith("attempt ")]
    assert attempts[0] == "attempt 0 exited 75" and attempts[-1] == f"attempt {len(attempts) - 1} exited 0", log[-3000:]
    assert "TERM reached the launcher: sending SIGUSR2" in log, log[-3000:]
    assert "every rank stopped at a committed checkpoint (exit 75)" in log and "Traceback" not in log, log[-3000:]
    resumed = [line for line in log.splitlines() if line.startswith("legato: rank 0: resumed at step")]
    assert resumed and all("verified" in line for line in resumed), log[-3000:]
    assert_same_run(reference, run_dir, 25, UNSEEDED)


# A job script shaped like the README's, with a hang nobody announces: one rank SIGSTOPped from outside mid-run. The watchdog's bound is
# shortened (a floor of 5 quiet seconds) and the steps slowed a little (0.3 s, bits unchanged) so that it finds the
# first attempt still training.
HUNG_JOB = """#!/bin/bash
#SBATCH --job-name=legato-hung --nodes=1 --ntasks=1 --cpus-per-task=2 --requeue --open-mode=append
#SBATCH --output={out} --chdir={root}
export PYTHONWARNINGS=ignore LEGATO_HANG=floor_s=5,phase_s=60 STEP_SLEEP_S=0.3
srun {python} -m legato.torchrun --max-restarts 0 --nproc-per-node 2 --master-port {port} {script} {run_dir}
rc=$?
echo "attempt ${{SLURM_RESTART_COUNT:-0}} exited $rc"
exec {python} -m legato.orchestrator.cli requeue {run_dir} --exit-code $rc
"""


def test_a_hung_rank_in_a_job_script_ends_the_attempt_and_the_requeued_job_resumes_exactly(cluster, tmp_path: Path) -> None:
    """The job-script path's hang: a rank SIGSTOPped from outside by pid, the watchdog ends the attempt (every rank's
    stacks, a `hang` record naming it, exit 124 through the launcher), `legato requeue` requeues the hung job, and the
    next run of the same job resumes verified and ends on the bits of an uninterrupted launch."""
    run_dir, out, script = tmp_path / "run", tmp_path / "slurm.out", ROOT / "tests" / "helpers" / "hang_loop.py"
    job_id = submit(HUNG_JOB, tmp_path, script)
    try:
        wait_for(lambda: steps_done(run_dir) >= 6, timeout=240, what="the first attempt's sixth step")
        launcher = wait_for(lambda: _launcher_of(run_dir), timeout=60, what="the job's launcher")
        stopped = children(launcher)[-1]
        environ = dict(item.partition(b"=")[::2] for item in Path(f"/proc/{stopped}/environ").read_bytes().split(b"\0"))
        os.kill(stopped, signal.SIGSTOP)
        reference = tmp_path / "reference"
        with reaped(start_ranks(script, reference, 2)) as procs:
            assert [p.wait(timeout=300) for p in procs] == [0, 0], stderr_tails(reference)
        show = _wait_finished(job_id, timeout=420)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    log = out.read_text()
    assert "JobState=COMPLETED" in show and "Restarts=1" in show, show + log[-3000:]
    assert "attempt 0 exited 124" in log and "attempt 1 exited 0" in log and "hung (exit 124)" in log, log[-3000:]
    (hang,) = [e for e in ledger(run_dir) if e["event"] == "hang"]
    assert hang["stopped"] == [f"rank {environ[b'RANK'].decode()}"], hang
    assert (run_dir / hang["stacks"] / "rank0.txt").is_file() and (run_dir / hang["stacks"] / "rank1.txt").is_file(), hang
    resumed = [e for e in ledger(run_dir) if e["event"] == "resumed"]
    assert [e["match"] for e in resumed] == [True], resumed
    finished = [e for e in ledger(run_dir) if e["event"] == "finished"]
    reference_finished = [e for e in ledger(reference) if e["event"] == "finished"]
    assert finished[-1]["final_global_hash"] == reference_finished[-1]["final_global_hash"]


def _launcher_of(run_dir: Path) -> int | None:
    """The pid of the `python -m legato.torchrun` writing into `run_dir`, once it has started both ranks."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"legato.torchrun" in argv and str(run_dir).encode() in argv and len(children(int(entry.name))) == 2:
            return int(entry.name)
    return None


def test_the_job_script_legato_init_writes_runs_stops_requeues_and_finishes_as_written(cluster, tmp_path: Path) -> None:
    """`legato init`'s job.sbatch, submitted unchanged from its folder (the script's `python` and `legato` found on the
    PATH the job inherits, as a user's venv is): a stop after step 20 (planted: the rank sends itself the signal),
    exit 75, `legato requeue` requeues, the second run resumes verified and finishes, COMPLETED after one restart."""
    folder = tmp_path / "start"
    assert legato("init", str(folder), "--name", "demo", "--steps", "40").returncode == 0
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    env = ["--export", f"ALL,PATH={path},LEGATO_CHAOS_SIGNAL_AT=20", "--output", str(tmp_path / "slurm.out")]
    job_id = subprocess.run(
        ["sbatch", "--parsable", *env, "job.sbatch"], cwd=folder, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        show = _wait_finished(job_id, timeout=300)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    log = (tmp_path / "slurm.out").read_text()
    assert "JobState=COMPLETED" in show and "Restarts=1" in show, show + log[-3000:]
    summary = status(folder / "runs" / "demo")
    assert summary["state"] == "finished" and [a["resumed_from_step"] for a in summary["attempts"]] == [None, 21], summary
    assert summary["all_resumes_verified"]
