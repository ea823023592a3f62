"""A resume on a CPU of another kind, with real processes: a 2-rank run stopped while torch's CPU kernels used the
baseline instruction set (ATEN_CPU_CAPABILITY=default) is refused when resumed with this CPU's own (AVX2, AVX512:
kernels that round differently), one paragraph naming both and the fix, its checkpoints untouched; with the
variable set as the paragraph says, it resumes verified. The rule itself, in one process: unit/test_cpu_capability.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST_GPT, ROOT, TINY_GPT, manifest

NATIVE = torch.backends.cpu.get_cpu_capability()


def trainer(run_dir: Path, capability: str | None, *sets: str) -> subprocess.CompletedProcess:
    """A 2-rank trainer run whose ranks use CPU kernels for `capability` (None: the CPU's own)."""
    cmd = [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", "--set", f"run.dir={run_dir}"]
    for item in (*FAST_GPT, "train.steps=6", "train.num_workers=0", *sets):
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["PYTHONWARNINGS"] = "ignore"
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.skipif(NATIVE == "DEFAULT", reason="this CPU's kernels are the baseline set: no other kind to resume on")
def test_a_resume_on_another_cpu_kind_is_refused_naming_it_and_resumes_verified_with_the_kernels_pinned(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = trainer(run_dir, "default", "chaos.signal_at_steps=[2]")
    assert first.returncode == 75, first.stderr[-3000:]
    stopped = manifest(run_dir)
    assert [entry["cpu_capability"] for entry in stopped["ranks"]] == ["DEFAULT", "DEFAULT"]
    saved = {p.name: (p / "manifest.json").read_bytes() for p in (run_dir / "checkpoints").iterdir()}

    moved = trainer(run_dir, None)
    assert moved.returncode == 2, moved.stderr[-3000:]
    assert f"ranks 0, 1: DEFAULT when written, {NATIVE} now" in moved.stderr
    assert "ATEN_CPU_CAPABILITY=default" in moved.stderr and "Traceback" not in moved.stderr
    assert {p.name: (p / "manifest.json").read_bytes() for p in (run_dir / "checkpoints").iterdir()} == saved

    pinned = trainer(run_dir, "default")
    assert pinned.returncode == 0, pinned.stderr[-3000:]
    assert f"rank 0: resumed at step {stopped['step']} from" in pinned.stderr and "verified by a replay of" in pinned.stderr
    assert manifest(run_dir)["step"] == 6 and {entry["cpu_capability"] for entry in manifest(run_dir)["ranks"]} == {"DEFAULT"}
