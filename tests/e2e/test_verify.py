"""`legato verify`: passes on exact configs, and names the first divergent step and the cause of every planted fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, run_trainer

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"


def verify(tmp_path: Path, *args: str, sets: tuple[str, ...] = (), env_extra: dict | None = None) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", "verify", str(TINY_GPT), "--out", str(tmp_path / "verify"), "--json", *args]
    for item in (*FAST_GPT, *sets):
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env_extra or {}))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
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


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_planted_fault_is_named_with_its_first_divergent_step(tmp_path: Path, fault: str) -> None:
    sets, needles = FAULTS[fault]
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", sets=sets)
    assert code == 1, out[-3000:]
    assert not verdict["identical"]
    for needle in needles:
        assert needle in verdict["cause"], verdict["cause"]
    # The signal after step 12 stops the run after step 13; the first resumed step, 14, is the first to differ.
    assert verdict["resumes"][0]["step"] == 13
    assert verdict["divergence"]["step"] == 14, verdict["divergence"]


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
