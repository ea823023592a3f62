"""The suite's warm start (tests/helpers/warm.py) gives a rank what a cold `python script.py` gives it: the same
bits at the end of a DDP run, its own pid for signals from outside, its exit code, its streams, an unshared global
RNG, no extra thread; and it starts cold whenever the interpreter's or torch's start could differ. The local launcher
`python -m legato`, as `run_trainer` starts it warm, trains the same bits as a cold one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import FAST_GPT, TINY_GPT, _started_by, codes, manifest, run_ranks, run_trainer
from helpers import warm

# A 2-rank DDP regression with a DataLoader worker: what it prints is how it started and how it ended, bit for bit.
SCRIPT = """
import json, os, sys, threading
started = {"torch_preloaded": "torch" in sys.modules, "threads": len(os.listdir("/proc/self/task"))}
print(json.dumps(started), file=sys.stderr, flush=True)
import numpy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "raise":
    raise ValueError("planted in the script")
if sys.argv[1] == "wait":
    threading.Event().wait(120)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = torch.utils.data.DistributedSampler(data, seed=3)
for x, y in torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler, num_workers=1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
ended = [p.double().sum().item().hex() for p in model.parameters()]
out = {"ended": ended, "numpy_draw": int(numpy.random.randint(1 << 30))}
print(json.dumps(out), file=sys.stderr)
dist.destroy_process_group()
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "ddp_script.py"
    path.write_text(SCRIPT)
    return path


def _result(proc: subprocess.CompletedProcess) -> dict:
    """How the script started and how it ended (its first and last lines on stderr)."""
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    return {**lines[0], **lines[-1]}


def test_a_warm_ddp_run_ends_bitwise_as_a_cold_one_and_starts_as_a_fresh_process_does(
    script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm_runs = run_ranks([sys.executable, str(script), "train"])
    assert codes(warm_runs) == [0, 0], warm_runs[0].stderr[-2000:]
    monkeypatch.setenv("LEGATO_TEST_WARM", "0")
    cold_runs = run_ranks([sys.executable, str(script), "train"])
    assert codes(cold_runs) == [0, 0], cold_runs[0].stderr[-2000:]
    hot, cold = [_result(p) for p in warm_runs], [_result(p) for p in cold_runs]
    assert [r["torch_preloaded"] for r in hot] == [True, True] and [r["torch_preloaded"] for r in cold] == [False, False]
    assert [r["ended"] for r in hot] == [r["ended"] for r in cold]
    assert hot[0]["ended"] == hot[1]["ended"]  # DDP kept the ranks' replicas equal
    # A fork shares its parent's numpy RNG; a fresh interpreter draws its own seed from the OS, and so does a warm rank.
    assert hot[0]["numpy_draw"] != hot[1]["numpy_draw"]
    # numpy's BLAS pool aside, nothing runs beside the script at its start, warm or cold.
    assert [r["threads"] for r in hot] == [r["threads"] for r in cold]


def test_an_environment_read_at_start_up_or_a_launcher_starts_cold(script: Path) -> None:
    env = {**warm.server_env(), "RANK": "0"}
    assert warm.warm_enough([sys.executable, str(script), "exit", "0"], env)
    assert not warm.warm_enough([sys.executable, str(script), "exit", "0"], {**env, "OMP_NUM_THREADS": "7"})
    assert not warm.warm_enough([sys.executable, str(script), "exit", "0"], {**env, "PYTHONHASHSEED": "1"})
    assert not warm.warm_enough([sys.executable, "-m", "legato.torchrun", str(script)], env)
    assert warm.warm_enough([sys.executable, "-m", "legato", str(TINY_GPT)], env)
    assert not warm.warm_enough([sys.executable, "-m", "legato", str(TINY_GPT)], {**env, "PYTHONHASHSEED": "7"})
    for extra, preloaded in (({}, True), ({"OMP_NUM_THREADS": "7"}, False)):
        started = run_ranks([sys.executable, str(script), "exit", "0"], world_size=1, **extra)
        assert codes(started) == [0] and _result(started[0])["torch_preloaded"] is preloaded, started[0].stderr[-2000:]


def test_exit_codes_tracebacks_and_signals_from_outside_reach_the_warm_rank_alone(script: Path, tmp_path: Path) -> None:
    env = {**warm.server_env(), "RANK": "0"}
    with tempfile.TemporaryFile("w+") as log:
        assert warm.start([sys.executable, str(script), "exit", "75"], env, stderr=log).wait(120) == 75
    with tempfile.TemporaryFile("w+") as log:
        assert warm.start([sys.executable, str(script), "raise"], env, stderr=log).wait(120) == 1
        log.seek(0)
        assert "ValueError: planted in the script" in log.read()
    with tempfile.TemporaryFile("w+") as log:
        waiting = [warm.start([sys.executable, str(script), "wait"], env, stderr=log) for _ in range(2)]
        assert all(isinstance(p, warm.WarmRank) for p in waiting)
        waiting[0].send_signal(signal.SIGTERM)
        assert waiting[0].wait(120) == -signal.SIGTERM
        assert waiting[1].poll() is None  # its sibling, forked from the same server, runs on
        waiting[1].kill()
        assert waiting[1].wait(120) == -signal.SIGKILL


def test_the_cleanup_after_a_test_kills_only_what_that_test_started(request: pytest.FixtureRequest) -> None:
    """Ledger pids are reused (they wrap at 32768 here): a process another test started under a pid this test's ledger
    names must survive this test's cleanup, as must the warm server; this test's own processes must not."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    mine = subprocess.Popen(sleeper)
    theirs = subprocess.Popen(sleeper, env={**os.environ, "PYTEST_CURRENT_TEST": "tests/e2e/test_other.py::test_it (call)"})
    try:
        assert _started_by(mine.pid, request.node.nodeid)
        assert not _started_by(theirs.pid, request.node.nodeid)
        assert "PYTEST_CURRENT_TEST" not in warm.server_env()
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()


def test_the_local_launcher_started_warm_trains_the_bits_of_a_cold_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop at a checkpoint (exit 75), then the resume to the end: warm, then cold, the same final bits."""
    sets = (*FAST_GPT, "train.steps=6", "chaos.signal_rank=1", "chaos.signal_at_steps=[3]")
    for label in ("warm", "cold"):
        if label == "cold":
            monkeypatch.setenv("LEGATO_TEST_WARM", "0")
        for expected in (75, 0):
            proc = run_trainer(TINY_GPT, tmp_path / label, *sets)
            assert proc.returncode == expected, proc.stderr[-2000:]
    assert manifest(tmp_path / "warm")["step"] == 6
    assert manifest(tmp_path / "warm")["global_hash"] == manifest(tmp_path / "cold")["global_hash"]
