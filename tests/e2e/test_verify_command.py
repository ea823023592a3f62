"""`legato verify --command`: any script, launched by real torchrun (2 ranks, gloo), proved bitwise or caught.

The ported ImageNet-style loop (it seeds every RNG it uses) verifies
identical through 2 real stops and relaunches. The ported nanoGPT loop leaves
python's and numpy's global RNGs unseeded: its state differs between any two
processes, and verify says so, naming them, instead of calling it identical.
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


def verify(tmp_path: Path, script: str, steps: str, *script_args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    command = (f"{sys.executable} -m legato.torchrun --nproc-per-node 2 --master-port {free_port()} {PORT / script} "
               f"{{run_dir}} {' '.join(script_args)}")
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
        "--json",
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
def test_a_script_with_unseeded_global_rngs_is_caught_and_named(tmp_path: Path) -> None:
    proc, verdict = verify(tmp_path, "nanogpt_legato.py", "7")
    assert proc.returncode == 1
    assert verdict is not None and not verdict["identical"]
    assert set(verdict["divergence"]["components"]) == {"rng.numpy", "rng.python"}
    assert "two uninterrupted runs of the same config already differ" in verdict["cause"]


def test_a_command_without_its_run_dir_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "legato.orchestrator.cli", "verify", "--command", "python train.py", "--interrupt-at", "3", "--out",
           str(tmp_path / "v")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not name {run_dir}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "v").exists()
