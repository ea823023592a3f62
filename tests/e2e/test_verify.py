"""`legato verify`: passes on exact configs, and names the first divergent step and the cause of every planted fault."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, run_trainer
from helpers.shared_runs import SharedRuns, run_key

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"


def run_verify(tmp_path: Path, *args: str, sets: tuple[str, ...] = (), env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`legato verify` of the tiny GPT (FAST_GPT and `sets`) with `args`, its runs under tmp_path/verify."""
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", "verify", str(TINY_GPT), "--out", str(tmp_path / "verify"), *args]
    for item in (*FAST_GPT, *sets):
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env_extra or {}))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def verify(tmp_path: Path, *args: str, sets: tuple[str, ...] = (), env_extra: dict | None = None) -> tuple[int, dict, str]:
    """A verify that reaches a verdict: its exit code, the verdict (--json) and its output."""
    proc = run_verify(tmp_path, "--json", *args, sets=sets, env_extra=env_extra)
    start = proc.stdout.index("\n{") + 1 if "\n{" in proc.stdout else proc.stdout.index("{")
    return proc.returncode, json.loads(proc.stdout[start:]), proc.stdout + proc.stderr


# Chosen steps with loader workers, random steps without: each verify costs two full runs, so the two kinds of
# interruption share the two loader settings instead of running all four combinations.
@pytest.mark.parametrize(("workers", "interruptions"), [(2, ("--interrupt-at", "7,19")), (0, ("--interruptions", "3", "--seed", "1"))])
def test_chosen_and_random_interruptions_are_bitwise_identical(tmp_path: Path, workers: int, interruptions: tuple[str, ...]) -> None:
    code, verdict, out = verify(tmp_path, *interruptions, sets=(f"train.num_workers={workers}",))
    assert code == 0, out[-3000:]
    assert verdict["identical"] and verdict["reference_final_hash"] == verdict["run_final_hash"]
    if "--interrupt-at" in interruptions:
        assert [r["step"] for r in verdict["resumes"]] == [8, 20]
        assert verdict["plot"].endswith("loss.png") and Path(verdict["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert len(verdict["resumes"]) == 3


FAULTS = {
    "numpy": (("chaos.skip_restore=[numpy]",), ("RNG component was not restored", "numpy's generator", "rng.numpy")),
    "torch": (("chaos.skip_restore=[torch]",), ("torch's CPU generator", "rng.torch")),
    "sampler": (("chaos.skip_restore=[data]",), ("sampler's epoch or position was not restored",)),
    "optimizer": (("chaos.skip_restore=[optimizer]",), ("optimizer state is missing",)),
    "scheduler": (("chaos.skip_restore=[scheduler]",), ("scheduler state is missing",)),
    "ordering": (("chaos.consume_rng_after_restore=[torch]",), ("random numbers were drawn between the restore and the first step",)),
}


@pytest.fixture
def reference(shared_runs: SharedRuns) -> Path:
    """The reference run of a clean verify of the tiny GPT stopped after step 12 (which must pass), trained once per
    suite: the planted faults below are each compared against it with --reference (the reference clears every chaos
    setting, so theirs would be this very run)."""

    def build(run_dir: Path) -> None:
        code, verdict, out = verify(run_dir, "--interrupt-at", "12")
        assert code == 0 and verdict["identical"], out[-3000:]

    return shared_runs.get(run_key("verify_reference", "12"), build) / "verify" / "reference"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_planted_fault_is_named_with_its_first_divergent_step(tmp_path: Path, reference: Path, fault: str) -> None:
    sets, needles = FAULTS[fault]
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", "--reference", str(reference), sets=sets)
    assert code == 1, out[-3000:]
    assert f"reference run: reusing {reference}" in out and not (tmp_path / "verify" / "reference").exists()
    assert not verdict["identical"]
    for needle in needles:
        assert needle in verdict["cause"], verdict["cause"]
    # The signal after step 12 stops the run after step 13; the first resumed step, 14, is the first to differ.
    assert verdict["resumes"][0]["step"] == 13
    assert verdict["divergence"]["step"] == 14, verdict["divergence"]


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (("train.lr=0.5",), "(train.lr differ"),
        (("checkpoint.replay_steps=2",), "(checkpoint.replay_steps differ"),
        (("train.steps=40",), "train.steps"),
        (("chaos.step_sleep_s=0.01",), "(chaos.step_sleep_s differ"),
    ],
)
def test_a_reference_trained_otherwise_is_refused_before_anything_runs(tmp_path: Path, reference: Path, sets: tuple, needle: str) -> None:
    code, out = verify_refused(tmp_path, "--interrupt-at", "12", "--reference", str(reference), sets=sets)
    assert code == 2 and needle in out and "--reference" in out and "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "verify").exists()


def test_a_reference_that_is_no_finished_verify_run_is_refused(tmp_path: Path, reference: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, out = verify_refused(tmp_path, "--interrupt-at", "12", "--reference", str(tmp_path / "empty"))
    assert code == 2 and "holds no captured config" in out and "Traceback" not in out, out[-3000:]

    unfinished = tmp_path / "unfinished"
    shutil.copytree(reference, unfinished)
    ledger = unfinished / "ledger.jsonl"
    ledger.write_text("".join(line for line in ledger.read_text().splitlines(keepends=True) if '"event": "finished"' not in line))
    code, out = verify_refused(tmp_path, "--interrupt-at", "12", "--reference", str(unfinished))
    assert code == 2 and "has not finished" in out and "Traceback" not in out, out[-3000:]

    # The interrupted run beside it: planted stops, so other chaos settings (and it resumed).
    code, out = verify_refused(tmp_path, "--interrupt-at", "12", "--reference", str(reference.parent / "interrupted"))
    assert code == 2 and "chaos.signal_at_steps" in out and "Traceback" not in out, out[-3000:]
    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed)
    with (resumed / "ledger.jsonl").open("a") as ledger_file:
        ledger_file.write(json.dumps({"event": "resumed", "step": 8, "match": True, "time": 0}) + "\n")
    code, out = verify_refused(tmp_path, "--interrupt-at", "12", "--reference", str(resumed))
    assert code == 2 and "was interrupted and resumed" in out and "Traceback" not in out, out[-3000:]


def test_a_reused_reference_that_parts_before_any_resume_is_named_not_the_resume(tmp_path: Path, reference: Path) -> None:
    """A reference from another machine (planted: the copy's step 1 loss bits changed) parts from this run at step 1:
    the cause names the reused reference, and no reference is trained to compare with."""
    stale = tmp_path / "stale"
    shutil.copytree(reference, stale)
    for trajectory in (stale / "trajectory").glob("rank*.jsonl"):
        lines = trajectory.read_text().splitlines()
        first = json.loads(lines[0])
        first["loss_hex"] = float.hex(float.fromhex(first["loss_hex"]) * 2)
        trajectory.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", "--reference", str(stale))
    assert code == 1 and not verdict["identical"] and verdict["divergence"]["step"] == 1, out[-3000:]
    assert f"differs from the reused reference {stale} at step 1" in verdict["cause"] and verdict["reference"] == str(stale)
    assert not (tmp_path / "verify" / "again").exists() and not (tmp_path / "verify" / "reference").exists()


def verify_refused(tmp_path: Path, *args: str, sets: tuple[str, ...] = ()) -> tuple[int, str]:
    """A verify that must refuse its input: its exit code and output (no verdict to read)."""
    proc = run_verify(tmp_path, *args, sets=sets)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_non_deterministic_user_entrypoint_is_told_apart_from_a_resume_fault(tmp_path: Path) -> None:
    sets = ("train.entrypoint=my_training:main", "train.options.unseeded_noise=true", "train.lr=0.01")
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", sets=sets, env_extra={"PYTHONPATH": str(EXAMPLES)})
    assert code == 1, out[-3000:]
    assert "non-deterministic operation" in verdict["cause"] and "step 1 " in verdict["cause"], verdict["cause"]
    assert verdict["divergence"]["step"] == 1


def test_a_user_entrypoint_on_the_public_api_verifies(tmp_path: Path) -> None:
    sets = ("train.entrypoint=my_training:main", "train.lr=0.01")
    code, verdict, out = verify(tmp_path, "--interrupt-at", "5,17", sets=sets, env_extra={"PYTHONPATH": str(EXAMPLES)})
    assert code == 0, out[-3000:]
    assert verdict["identical"] and len(verdict["resumes"]) == 2


def test_compare_names_a_world_size_change(tmp_path: Path) -> None:
    two, one = tmp_path / "two", tmp_path / "one"
    assert run_trainer(TINY_GPT, two, *FAST_GPT, "train.steps=6").returncode == 0
    assert run_trainer(TINY_GPT, one, *FAST_GPT, "train.steps=6", nproc=1).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "verify", "--compare", str(two), str(one)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "world size changed: 2 ranks against 1" in proc.stdout


def test_plot_of_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_trainer(TINY_GPT, run, *FAST_GPT, "train.steps=6").returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "plot", str(run)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
