"""The root of the test suite: its layers, how they are scheduled, and the helpers they share to run the real
trainer in real processes and read what it wrote. It must NEVER hold a test.

The tests sit in three layers, one folder each; a test's folder says what it starts:

- tests/unit: in one process, no subprocess (DataLoader workers aside) and no process group; the whole layer
  runs in under three minutes on two cores (`pytest tests/unit`). A module's helpers live in the module.
- tests/e2e: real processes: the CLI and its supervisor, ranks under real torch.distributed (gloo), real
  torchrun, the real submitit local executor, real signals. Marked `slow` where a test runs a training.
- tests/cluster: the real SLURM clusters that `legato devcluster` starts (installing SLURM where it can, as
  root with apt-get), every test marked `slurm`; skipped where no cluster can start, failed under CI=true.

tests/helpers holds the training scripts that e2e tests run by path (and unit tests import): byo_loops.py,
replay_loops.py, ddp_attempts.py. Test modules import this file's helpers as `from conftest import ...`, so a
test module's name is unique across the layers (pytest imports them by base name). A run that several tests read
unchanged (a reference, a run stopped once) is trained once per suite through the `shared_runs` fixture
(helpers/shared_runs.py); a test that changes such a run works on its own copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import warm
from helpers.shared_runs import SharedRuns, run_key, shared_root

from legato.runtime.launch import free_port
from legato.system.launch_env import HASH_SEED

ROOT = Path(__file__).resolve().parent.parent
TINY_GPT = ROOT / "configs" / "tiny_gpt.yaml"
MLP = ROOT / "configs" / "mlp.yaml"
# Inherited by every process the suite starts: one that dies of a fatal signal (an abort in C++ code, a segfault)
# prints each of its threads' Python stacks to its stderr first, which the failing assertion then carries.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
# torch.compile's first kernel in a process otherwise checks each vector instruction set the CPU reports by compiling
# a probe and loading it in a fresh interpreter (about ten per process, 0.15 s of CPU each; 24 of a compiled DDP
# test's 86 CPU-s). Both sides of every comparison run under the same setting, and the kernels are those of the set the CPU
# reports, so the compiled tests check what they did.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# A short corpus so that epochs are a few steps long and a test sees several of them;
# ranks agree every step so that a signal after step s stops the run after step s + 1;
# a replay base every 4 steps, so resumes replay from a base past step 0 (the steps rule alone: replay_cost 0 keeps a
# copy that costs more than 2% of such short steps from moving the bases the tests expect).
# The shipped config's demo preemptions are switched off; tests plant their own.
FAST_GPT = (
    "train.steps=30",
    "train.options.sentences=100",
    "checkpoint.every_steps=0",
    "checkpoint.hash_every_steps=3",
    "checkpoint.agree_every_steps=1",
    "checkpoint.replay_steps=4",
    "checkpoint.replay_cost=0",
    "chaos.signal_at_steps=[]",
)

# torch.compile on the CPU builds its kernels with the C++ compiler inductor looks for ($CXX, else g++).
NEEDS_CXX = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX") or "g++") is None, reason="torch.compile on the CPU needs a C++ compiler ($CXX or g++)"
)

LAYERS = ("unit", "e2e", "cluster")


def _builds_module_fixtures(item: pytest.Item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)
    defs = fixtures.name2fixturedefs.values() if fixtures else ()
    return any(d.scope in ("module", "package") for chain in defs for d in chain)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test with its layer, from its folder (`-m unit`, `-m "not cluster"`). For `pytest -n N --dist
    loadgroup` (scripts/test.sh): the tests of a module that builds a module fixture (a reference run, or a SLURM
    cluster) run on one worker, so that it is built once; the group is keyed by the module's path, as two folders may
    hold modules of one name. So the one-node and the multi-node cluster (own ports, configs and state, made to
    coexist) serve their modules side by side on two workers, each module's jobs one at a time. Every other test goes
    to whichever worker is free: a module of long tests no longer keeps one worker busy while the other idles."""
    path = item.nodeid.split("::")[0]
    layer = next((part for part in Path(path).parts if part in LAYERS), None)
    if layer:
        item.add_marker(getattr(pytest.mark, layer))
    if item.get_closest_marker("slurm") or _builds_module_fixtures(item):
        item.add_marker(pytest.mark.xdist_group(path))


def _expected_cost(item: pytest.Item) -> int:
    """A rank, longest first: the SLURM chain, then end-to-end runs, then the other end-to-end tests, then unit."""
    if item.get_closest_marker("slurm"):
        return 0
    if item.get_closest_marker("unit"):
        return 3
    return 1 if item.get_closest_marker("slow") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first, so that the short tests fill the gaps at the end (scripts/test.sh keeps this order with
    --no-loadscope-reorder): the SLURM tests lead, being the longest chain, mostly waiting on the scheduler. The
    sort is stable, so a module's tests keep their order."""
    items.sort(key=_expected_cost)


def run_trainer(config: Path, run_dir: Path, *sets: str, nproc: int = 2, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m legato CONFIG --nproc N` to its end, as `subprocess.run` with its output captured would; the launcher
    starts warm (helpers/warm.py) under legato's own hash seed, which it would otherwise run itself again to take."""
    cmd = [sys.executable, "-m", "legato", str(config), "--nproc", str(nproc), "--set", f"run.dir={run_dir}"]
    for item in sets:
        cmd += ["--set", item]
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONHASHSEED=HASH_SEED)
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        launcher = warm.start(cmd, env, stdout=out, stderr=err, cwd=str(ROOT))
        try:
            code = launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.kill()  # its ranks die with it (their parent-death signal)
            launcher.wait()
            raise
        return subprocess.CompletedProcess(cmd, code, _read(out), _read(err))


def run_ranks(cmd: list[str], world_size: int = 2, timeout: float = 180, **env: str) -> list[subprocess.CompletedProcess]:
    """Start `cmd` as every rank of a torchrun-style world (RANK, WORLD_SIZE, MASTER_*) and wait for them all; a
    script's ranks start warm (helpers/warm.py: forked from a process that imported torch once)."""
    port = free_port()
    procs = []
    # stderr goes to files, not pipes read after the wait: a rank that writes more than a pipe holds (64 KiB of logs over
    # a long run) would block in write() holding its logging lock, and every thread that logs after it would wait on
    # that lock until the timeout. A DataLoader worker shares its rank's stderr, so a pipe would also stay open (and a
    # read block) while a worker outlives its rank.
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile(mode="w+")) for _ in range(world_size)]
        for rank in range(world_size):
            full = dict(
                os.environ,
                PYTHONHASHSEED="0",
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                PYTHONWARNINGS="ignore",
                **env,
            )
            procs.append(warm.start(cmd, full, stderr=logs[rank]))
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
            return [subprocess.CompletedProcess(p.args, code, "", _read(log)) for p, code, log in zip(procs, codes, logs)]
        except subprocess.TimeoutExpired:
            raise AssertionError(_hung(procs, logs, timeout)) from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()


def _hung(procs: list[subprocess.Popen], logs: list, timeout: float) -> str:
    """Why a world did not finish: which ranks still ran, and each rank's stderr tail, with the stacks of every thread of
    the ones that hung (SIGABRT, which PYTHONFAULTHANDLER, set above for every process, turns into a dump)."""
    hung = [rank for rank, p in enumerate(procs) if p.poll() is None]
    for rank in hung:
        procs[rank].send_signal(signal.SIGABRT)
    for rank in hung:
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[rank].wait(timeout=30)
    tails = "\n".join(
        f"--- rank {rank} (exit {p.poll()}) stderr tail:\n{_read(log)[-6000:]}" for rank, (p, log) in enumerate(zip(procs, logs))
    )
    return f"ranks {hung} still ran after {timeout:.0f}s; their stacks follow (SIGABRT)\n{tails}"


def _read(log) -> str:
    log.seek(0)
    return log.read()


def codes(procs: list[subprocess.CompletedProcess]) -> list[int]:
    return [p.returncode for p in procs]


def run_to_completion(config: Path, run_dir: Path, *sets: str, max_attempts: int = 6) -> list[subprocess.CompletedProcess]:
    """Run the same command until it exits 0 (each 75 is a stop at a checkpoint); returns every attempt."""
    attempts = []
    for _ in range(max_attempts):
        proc = run_trainer(config, run_dir, *sets)
        attempts.append(proc)
        if proc.returncode != 75:
            break
    assert attempts[-1].returncode == 0, attempts[-1].stderr[-3000:]
    return attempts


def manifest(run_dir: Path, step: int | None = None) -> dict:
    root = run_dir / "checkpoints"
    path = root / f"step_{step}" if step is not None else max(root.glob("step_*"), key=lambda p: int(p.name[5:]))
    return json.loads((path / "manifest.json").read_text())


def fit_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One plain step of an MSE regression, as the small in-process loops of the unit tests train; its loss."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def fit_run(run_dir: Path, loader: object, total_steps: int, features: int) -> object:
    """A one-rank Session over `loader` (batches of `features` inputs and one target), a linear model, SGD and the replay
    off, trained by fit_step to `total_steps`; the Session."""
    import legato

    model = torch.nn.Linear(features, 1)
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        loader=loader,
        total_steps=total_steps,
        checkpoint=legato.CheckpointPolicy(replay_steps=0),
    )
    for x, y in session:
        session.report(fit_step(model, session.optimizer, x, y))
    return session


def files_under(directory: Path) -> dict[Path, bytes]:
    """Every file under `directory` and its bytes (to show that a refused attempt changed none)."""
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def trajectory(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()]


def model_state(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step_{step}" / "model.pt", weights_only=True)


def assert_bitwise_equal(reference: Path, resumed: Path, steps: int, world_size: int = 2) -> None:
    """Same final global hash, same model tensors, same loss_hex and state hashes at every step on every rank."""
    ref_manifest, res_manifest = manifest(reference, steps), manifest(resumed, steps)
    assert res_manifest["global_hash"] == ref_manifest["global_hash"]
    ref_model, res_model = model_state(reference, steps), model_state(resumed, steps)
    assert ref_model.keys() == res_model.keys()
    for name in ref_model:
        assert torch.equal(ref_model[name], res_model[name]), name
    for rank in range(world_size):
        ref_traj, res_traj = trajectory(reference, rank), trajectory(resumed, rank)
        assert [r["step"] for r in res_traj] == list(range(1, steps + 1))
        assert [r["loss_hex"] for r in res_traj] == [r["loss_hex"] for r in ref_traj]
        assert res_traj == ref_traj


def resumed_steps(attempts: list[subprocess.CompletedProcess]) -> list[int]:
    """Steps at which an attempt resumed with a verified hash, read from rank logs."""
    found = []
    for proc in attempts:
        for line in proc.stderr.splitlines():
            if "rank0 " in line and "verified" in line and "resumed at step" in line:
                found.append(int(line.split("resumed at step ")[1].split()[0]))
    return found


def _run_pids(run_dir: Path) -> set[int]:
    """Every pid a run directory names: its supervisor, its local submitit controllers and its ranks."""
    pids: set[int] = set()
    holder = run_dir / "supervisor.json"
    if holder.is_file():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            pids.add(int(json.loads(holder.read_text())["pid"]))
    events = []
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    local = any(e.get("event") == "submitted" and e.get("executor") == "local" for e in events)
    for e in events:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if e["event"] == "rank_started":
                pids.add(int(e["pid"]))
            elif local and e["event"] in ("submitted", "resubmitted"):
                pids.add(int(e["job_id"]))  # a local job's id is its submitit controller's pid
    return pids - {os.getpid()}


def _started_by(pid: int, test: str) -> bool:
    """Whether process `pid` is one that test `test` (a node id) started: every process a test starts inherits pytest's
    PYTEST_CURRENT_TEST, which names it. A pid in a ledger may since have been reused by another test's process (pids
    wrap at 32768 on this machine, and the suite starts thousands); that one names its own test, and is left alone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"PYTEST_CURRENT_TEST={test} (".encode() in environ


@pytest.fixture(autouse=True)
def no_process_left_behind(tmp_path: Path, request: pytest.FixtureRequest):
    """Whatever a test started under its tmp_path (a detached supervisor, a local job, ranks) is killed when
    it ends, passed or failed, so one failure cannot leave a run competing with the rest of the suite."""
    yield
    for ledger in tmp_path.rglob("ledger.jsonl"):
        for pid in _run_pids(ledger.parent):
            if _started_by(pid, request.node.nodeid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    """Runs built once per pytest session, whichever worker asks first (helpers/shared_runs.py); read-only."""
    return SharedRuns(shared_root(tmp_path_factory.getbasetemp()))


def gpt_reference(shared_runs: SharedRuns, *sets: str) -> Path:
    """The uninterrupted 2-rank tiny GPT run of FAST_GPT and `sets` (shared: read it, copy it to change it)."""
    return shared_runs.get(run_key("gpt_reference", *sets), lambda run_dir: run_to_completion(TINY_GPT, run_dir, *FAST_GPT, *sets))


@pytest.fixture(scope="session")
def gpt_steps_per_epoch() -> int:
    from legato.tasks import build_task

    dataset = build_task("tiny_gpt", {"sentences": 100}, seed=1234).dataset
    return len(dataset) // 2 // 8
