"""torchrun launches of a ported loop (examples/port/nanogpt_legato.py): real torchrun, 2 ranks, gloo, real SIGUSR2.

One launch per attempt through `python -m legato.torchrun`: a stop at a
checkpoint is exit 75 (plain torchrun says exit 1 and a ChildFailedError),
the next launch resumes, and the run ends bit for bit where an uninterrupted
one ends. In-place restarts (`--max-restarts 2`, one launch, two stops): the
agent restarts both workers after each stop and they resume at once, bit for
bit. The static rendezvous, whose shared store makes restarted gloo workers
read dead peers' addresses, is refused for in-place restarts before anything starts, and so are a missing script and
no ranks at all.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.port import UNSEEDED, assert_same_run, torchrun_reference
from helpers.shared_runs import SharedRuns

from legato.runtime.launch import free_port

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "examples" / "port" / "nanogpt_legato.py"
STEPS = 25


def torchrun(out: Path, *launcher: str, signal_at: str = "", port: bool = True) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", LEGATO_CHAOS_SIGNAL_AT=signal_at, LEGATO_CHAOS_SIGNAL_RANK="1")
    address = ("--master-port", str(free_port())) if port else ()
    cmd = [*launcher, "--nproc-per-node", "2", *address, str(SCRIPT), str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


LEGATO_TORCHRUN = (sys.executable, "-m", "legato.torchrun")


@pytest.fixture
def reference(shared_runs: SharedRuns) -> Path:
    return torchrun_reference(shared_runs)


def resumes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("legato: rank 0: resumed at step")]


def test_one_torchrun_launch_per_attempt_exits_75_then_resumes_exactly(tmp_path: Path, reference: Path) -> None:
    resumed = tmp_path / "resumed"
    stopped = torchrun(resumed, *LEGATO_TORCHRUN, "--max-restarts", "0", signal_at="5")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "legato: every rank stopped at a committed checkpoint (exit 75)" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    last = torchrun(resumed, *LEGATO_TORCHRUN, "--max-restarts", "0", signal_at="5")
    assert last.returncode == 0, last.stderr[-3000:]
    assert "legato: rank 0: resumed at step 6 " in last.stderr and "verified" in last.stderr
    assert_same_run(reference, resumed, STEPS, UNSEEDED)


def test_max_restarts_requeues_in_place_twice_and_ends_exactly(tmp_path: Path, reference: Path) -> None:
    """One launch, `--max-restarts 2` on torchrun's own one-node rendezvous: two real stops, two in-place restarts."""
    resumed = tmp_path / "resumed"
    done = torchrun(resumed, *LEGATO_TORCHRUN, "--max-restarts", "2", signal_at="5,12", port=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Connection refused" not in done.stderr
    lines = resumes(done.stderr)
    assert [line.split()[6] for line in lines] == ["6", "13"] and all("verified" in line for line in lines), done.stderr[-3000:]
    assert_same_run(reference, resumed, STEPS, UNSEEDED)
    assert_unseeded_rng_check_catches_a_fresh_state(reference, resumed, tmp_path / "planted")


def test_max_restarts_on_the_static_rendezvous_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    refused = torchrun(out, *LEGATO_TORCHRUN, "--max-restarts", "2")
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    assert "static rendezvous" in refused.stderr and "--standalone" in refused.stderr
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("launch", "said"),
    [
        (("--nproc-per-node", "2", "no_such_train.py"), "the training script no_such_train.py is not a file"),
        (("--nproc-per-node", "0", str(SCRIPT)), "--nproc-per-node 0 starts no rank. Pass 1 or more, or auto."),
    ],
)
def test_a_launch_torchrun_would_fail_inside_its_agent_is_one_paragraph_and_exit_2(tmp_path: Path, launch: tuple, said: str) -> None:
    """Plain torchrun prints a ChildFailedError per rank for a missing script, and a bare AssertionError for no ranks."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    refused = subprocess.run(
        [*LEGATO_TORCHRUN, *launch, str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert said in refused.stderr and "Traceback" not in refused.stderr and "ChildFailedError" not in refused.stderr, refused.stderr
    assert not (tmp_path / "run").exists()


def test_the_run_checker_catches_a_planted_fault(tmp_path: Path, reference: Path) -> None:
    """assert_same_run on a copy of the reference with one loss one ulp off at one step of one rank."""
    lossy = tmp_path / "lossy"
    shutil.copytree(reference, lossy)
    traj = lossy / "trajectory" / "rank1.jsonl"
    rows = [json.loads(line) for line in traj.read_text().splitlines()]
    rows[9]["loss_hex"] = math.nextafter(float.fromhex(rows[9]["loss_hex"]), math.inf).hex()
    traj.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_same_run(reference, reference, STEPS, UNSEEDED)
    with pytest.raises(AssertionError):
        assert_same_run(reference, lossy, STEPS, UNSEEDED)


def assert_unseeded_rng_check_catches_a_fresh_state(reference: Path, resumed: Path, planted: Path) -> None:
    """Planted fault: the first stop's checkpoint of a copy of `resumed` holds another numpy state on rank 0, as if
    the next attempt had kept its own fresh one instead of restoring it."""
    shutil.copytree(resumed, planted)
    first = min((planted / "checkpoints").glob("step_*"), key=lambda d: int(d.name[5:]))
    assert first.name != f"step_{STEPS}"
    manifest = json.loads((first / "manifest.json").read_text())
    manifest["ranks"][0]["components"]["rng.numpy"] = "0" * 32
    (first / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AssertionError, match="rng.numpy on rank 0 changed"):
        assert_same_run(reference, planted, STEPS, UNSEEDED)
