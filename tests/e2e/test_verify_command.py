"""`legato verify --command`: any script, launched by real torchrun (2 ranks, gloo), proved bitwise or caught.

The ported ImageNet-style loop (it seeds every RNG it uses) verifies
identical through 2 real stops and relaunches. The ported nanoGPT loop leaves
python's and numpy's global RNGs unseeded: their states differ between any two
processes, two uninterrupted runs included, while training never draws from
them; verify says training is bitwise identical and names them, and counts
the resumes the ranks proved by a replay.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from legato.runtime.launch import free_port

PORT = ROOT / "examples" / "port"


def verify(
    tmp_path: Path, script: str, steps: str, *script_args: str, as_json: bool = True
) -> tuple[subprocess.CompletedProcess, dict | None]:
    command = (
        f"{sys.executable} -m legato.torchrun --nproc-per-node 2 --master-port {free_port()} {PORT / script} "
        f"{{run_dir}} {' '.join(script_args)}"
    )
    out = tmp_path / "verify"
    cmd = [
        sys.executable,
        "-m",
        "legato.orchestrator.cli",
        "verify",
        "--command",
        command,
        "--interrupt-at",
        steps,
        "--signal-rank",
        "1",
        "--out",
        str(out),
        *(["--json"] if as_json else []),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    verdict = out / "verdict.json"
    return proc, json.loads(verdict.read_text()) if verdict.exists() else None


@pytest.mark.slow
def test_a_torchrun_script_verifies_bitwise_identical(tmp_path: Path) -> None:
    proc, verdict = verify(tmp_path, "imagenet_legato.py", "2,13", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert verdict is not None and verdict["identical"] and verdict["steps"] == 24
    assert [r["step"] for r in verdict["resumes"]] == [3, 14]
    assert len(list((tmp_path / "verify").glob("interrupted.attempt*.log"))) == 3


@pytest.mark.slow
def test_a_script_with_unseeded_global_rngs_verifies_its_training_and_names_them(tmp_path: Path) -> None:
    proc, verdict = verify(tmp_path, "nanogpt_legato.py", "7,13", as_json=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "DIVERGED" not in proc.stdout and "determinism.mode" not in proc.stdout
    assert "legato: training bitwise identical: 25 steps, 2 resumes (2 replay-verified)" in proc.stdout, proc.stdout
    # Each launch is announced as it starts, with its log: verify used to print nothing for minutes.
    out = tmp_path / "verify"
    assert f"legato: 1/2 reference run, uninterrupted (output: {out / 'reference.log'})" in proc.stdout
    assert f"legato: 2/2 interrupted run, attempt 3 (output: {out / 'interrupted.attempt3.log'})" in proc.stdout
    assert "the script's unseeded python's and numpy's RNG states (rng.python, rng.numpy) differ between any two runs" in proc.stdout
    assert verdict is not None and verdict["identical"] and verdict["unseeded"] == ["rng.numpy", "rng.python"]
    assert verdict["divergence"] is None and verdict["reference_final_hash"] != verdict["run_final_hash"]
    assert [(r["step"], r["match"], r["replay"]["identical"]) for r in verdict["resumes"]] == [(8, True, True), (14, True, True)]


def test_a_command_without_its_run_dir_is_refused(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "legato.orchestrator.cli",
        "verify",
        "--command",
        "python train.py",
        "--interrupt-at",
        "3",
        "--out",
        str(tmp_path / "v"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not name {run_dir}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()


@pytest.mark.slow
def test_an_unseeded_rng_that_feeds_training_is_still_a_divergence(tmp_path: Path) -> None:
    """The planted fault for the exemption above: the nanoGPT loop's learning rate jitters by python's unseeded global RNG,
    so two uninterrupted runs differ in their loss bits, not in RNG states alone; verify must not call that identical."""
    source = (PORT / "nanogpt_legato.py").read_text()
    jitter = source.replace("import math\n", "import math\nimport random\n").replace(
        "    lr = get_lr(iter_num)\n", "    lr = get_lr(iter_num) * (1 + random.random() * 1e-3)\n"
    )
    assert jitter.count("random.random()") == 1
    script = tmp_path / "nanogpt_jitter.py"
    script.write_text(jitter)
    proc, verdict = verify(tmp_path, str(script), "7", as_json=False)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "legato: DIVERGED at step" in proc.stdout and "bitwise identical" not in proc.stdout, proc.stdout
    assert "two uninterrupted runs of the same config already differ" in proc.stdout
    assert 'legato.seed_everything(seed, rank, mode="strict")' in proc.stdout and "determinism.mode" not in proc.stdout
    assert verdict is not None and not verdict["identical"] and verdict["unseeded"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("steps", "said"), [("500", "--interrupt-at 500: the command trains 24 steps"), ("23", "finished without a single stop")]
)
def test_a_proof_with_no_stop_is_refused_not_passed(tmp_path: Path, steps: str, said: str) -> None:
    """A stop past the end (refused once the reference run shows the run's length), or one so late that the run finishes
    before it lands: no resume happened, so verify exits 2 saying so, never "bitwise identical" with 0 resumes."""
    proc, verdict = verify(tmp_path, "imagenet_legato.py", steps, "2", as_json=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "identical" not in proc.stdout and verdict is None
