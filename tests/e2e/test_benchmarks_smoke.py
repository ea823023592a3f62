"""Every benchmark runs end to end at its smallest setting, so none rots between the runs that measure.

These are not measurements (nothing here asserts on a time): each benchmark script runs as a user runs it, in a
process of its own, and must exit 0, print its table and leave nothing behind in the temporary directory.
bench_multinode_requeue needs the multi-node SLURM devcluster and is exercised by hand (docs/multinode.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT

SMOKE = {
    "bench_defaults.py": (["--ranks", "2", "--mb", "1", "--rounds", "1", "--settle", "0", "--dir", "{tmp}"], "peak memory above"),
    "bench_core.py": (["--steps", "3", "--rounds", "1", "--mb", "1", "--repeats", "1", "--dir", "{tmp}"], "raw write + fsync"),
    "bench_restore.py": (
        ["--ranks", "2", "--mb", "1", "--rounds", "1", "--settle", "0", "--cache", "warm", "--dir", "{tmp}"],
        "resume / torch.load",
    ),
    "bench_checkpoint_async.py": (["--mb", "1", "--rounds", "1", "--dir", "{tmp}"], "async blocking / memory copy"),
    "bench_reduction.py": (["--world", "2", "--steps", "2", "--rounds", "1", "--hidden", "16"], "restored (legato)"),
    "bench_fsdp2_checkpoint.py": (["--mb", "1", "--rounds", "1", "--dir", "{tmp}"], "legato sharded checkpoint"),
    "bench_steps.py": (["--steps", "4", "--rounds", "1", "--workers", "0", "--batch", "4"], "legato Session, defaults"),
    "bench_replay.py": (["--steps", "12", "--rounds", "1", "--batch", "4", "--repeats", "1"], "resume to the first new step"),
    "bench_launch.py": (["--rounds", "1"], "python -m legato, MLP, defaults"),
    "bench_census.py": (["--rounds", "1", "--objects", "10"], "plain-object look (control)"),
    "bench_state_size.py": (["--mb", "1", "--steps", "4", "--warm", "2", "--rounds", "1", "--hidden", "16"], "defaults before 2026-11-29"),
    "bench_step_cpu.py": (["--steps", "20", "--warm", "2", "--rounds", "1"], "legato Session, defaults"),
    "bench_digest.py": (["--mb", "1", "--rounds", "1"], "device rule"),
}

# What torch itself leaves in TMPDIR: inductor's compile cache, and torchrun's log directories (plain torchrun
# leaves one per launch too).
TORCH_OWN = ("torchinductor_", "torchelastic_")


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_setting(script: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    args, table_line = SMOKE[script]
    # Short, so that AF_UNIX socket paths under it (multiprocessing, gloo) stay within their 108 bytes.
    scratch = Path(tempfile.mkdtemp(prefix="smoke-"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *(a.format(tmp=tmp_path) for a in args)]
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert table_line in proc.stdout, proc.stdout[-2000:]
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith(TORCH_OWN))
    assert not left, f"{script} left {left} in its TMPDIR"
