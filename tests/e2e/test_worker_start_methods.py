"""DataLoader workers under every start method (fork, forkserver, spawn): legato's per-sample seeding gives each
sample the same random numbers whatever the start method and worker count, workers die with their rank, and a
2-rank run with 2 workers a rank resumes bitwise under each (where the uninterrupted fork-started run ends).

Real worker processes, started by a real DataLoader in a script of its own (spawned workers re-import it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, codes, run_ranks, trajectory

SCRIPT = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from legato.state.worker_rng import SeedPerSample

class Noisy(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.rand(3).double() + i

def main():
    method, workers, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    kind = DataLoader
    if mode == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as kind
    loader = kind(Noisy(), batch_size=4, num_workers=workers, multiprocessing_context=method,
                  worker_init_fn=SeedPerSample(11, None))
    if mode == "hang":
        it = iter(loader)
        next(it)
        print(json.dumps([w.pid for w in it._workers]), flush=True)
        time.sleep(600)
    print(json.dumps([float(x).hex() for batch in loader for x in batch.flatten()]))

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workers") / "load.py"
    path.write_text(SCRIPT)
    return path


def _samples(script: Path, method: str, workers: int, mode: str = "run") -> list[str]:
    proc = subprocess.run([sys.executable, str(script), method, str(workers), mode], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_each_sample_draws_the_same_numbers_under_every_start_method(script: Path) -> None:
    reference = _samples(script, "fork", 2)
    assert len(reference) == 24 * 3
    assert _samples(script, "forkserver", 2) == reference
    assert _samples(script, "spawn", 1) == reference
    # torchdata's StatefulDataLoader runs the same worker_init_fn after its own base_seed + worker_id seeding.
    assert _samples(script, "fork", 2, "stateful") == reference


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_die_with_their_rank(script: Path, method: str) -> None:
    proc = subprocess.Popen([sys.executable, str(script), method, "2", "hang"], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        workers = json.loads(proc.stdout.readline())
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers)
    finally:
        proc.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_run_resumes_bitwise_under_every_start_method(tmp_path: Path) -> None:
    """helpers/loader_loops.py's cycle loop (k=2 micro-batches a step, augmentation from the global RNGs in the workers),
    stopped once mid-epoch and mid-accumulation (after step 9) and resumed, under fork, forkserver and spawn."""
    loops = ROOT / "tests" / "helpers" / "loader_loops.py"

    def launch(run_dir: Path, method: str, **env: str) -> list[subprocess.CompletedProcess]:
        args = [sys.executable, str(loops), str(run_dir), "--loop", "cycle", "--workers", "2", "--start-method", method]
        return run_ranks(args, timeout=300, **env)

    def seen(run_dir: Path, rank: int) -> tuple:
        return (
            (run_dir / f"batches_rank{rank}.jsonl").read_text(),
            (run_dir / f"params_rank{rank}.txt").read_text(),
            [r["loss_hex"] for r in trajectory(run_dir, rank)],
        )

    reference = tmp_path / "reference"
    assert codes(first := launch(reference, "fork")) == [0, 0], first[0].stderr[-3000:]
    for method in ("fork", "forkserver", "spawn"):
        resumed = tmp_path / method
        attempts = [launch(resumed, method, LEGATO_CHAOS_SIGNAL_AT="8", LEGATO_CHAOS_SIGNAL_RANK="1") for _ in range(2)]
        assert [codes(a) for a in attempts] == [[75, 75], [0, 0]], (method, attempts[-1][0].stderr[-3000:])
        assert "resumed at step 9 " in attempts[1][0].stderr and "verified" in attempts[1][0].stderr
        assert [seen(resumed, rank) for rank in range(2)] == [seen(reference, rank) for rank in range(2)], method


@pytest.mark.slow
def test_persistent_workers_resume_bitwise_mid_epoch_and_at_an_epoch_boundary(tmp_path: Path) -> None:
    """helpers/loader_loops.py's epochs loop (3 epochs of 6 steps, augmentation from the global RNGs in the workers,
    dropout) over a DataLoader with persistent_workers=True and 2 workers a rank: the Session draws the samples in the
    plain loop's order (their augmentation differs: the plain loop has no per-sample seeding), and a run stopped after
    step 8 (mid-epoch 1) and after step 12 (the end of epoch 1) resumes verified each time, and ends bit for bit where the
    uninterrupted run ends: every batch's bytes, every loss, the parameters."""
    loops = ROOT / "tests" / "helpers" / "loader_loops.py"

    def launch(run_dir: Path, *extra: str, **env: str) -> list[subprocess.CompletedProcess]:
        args = [sys.executable, str(loops), str(run_dir), "--loop", "epochs", "--workers", "2", "--persistent", *extra]
        return run_ranks(args, timeout=300, **env)

    def seen(run_dir: Path, rank: int) -> tuple:
        return (run_dir / f"batches_rank{rank}.jsonl").read_text(), (run_dir / f"params_rank{rank}.txt").read_text()

    def samples(run_dir: Path, rank: int) -> list:
        return [json.loads(line)["samples"] for line in (run_dir / f"batches_rank{rank}.jsonl").read_text().splitlines()]

    plain, reference, resumed = tmp_path / "plain", tmp_path / "reference", tmp_path / "resumed"
    assert codes(done := launch(plain, "--plain")) == [0, 0], done[0].stderr[-3000:]
    assert codes(done := launch(reference)) == [0, 0], done[0].stderr[-3000:]
    assert [samples(reference, rank) for rank in range(2)] == [samples(plain, rank) for rank in range(2)]
    attempts = [launch(resumed, LEGATO_CHAOS_SIGNAL_AT="7,11", LEGATO_CHAOS_SIGNAL_RANK="1") for _ in range(3)]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    for attempt, step in ((attempts[1], 8), (attempts[2], 12)):
        assert f"resumed at step {step} " in attempt[0].stderr and "verified" in attempt[0].stderr, attempt[0].stderr[-3000:]
    assert [seen(resumed, rank) for rank in range(2)] == [seen(reference, rank) for rank in range(2)]
    assert [r["loss_hex"] for r in trajectory(resumed, 0)] == [r["loss_hex"] for r in trajectory(reference, 0)]


def test_the_rank_harness_reads_a_rank_that_logs_more_than_a_pipe_holds() -> None:
    """The fork-started run that hung: ranks' stderr went to pipes read only after they exited, so a rank that logged more
    than 64 KiB blocked in write() holding its logging lock (its other threads then waited on that lock) until the
    harness timed out. run_ranks now sends stderr to files; this rank writes 256 KiB and exits at once."""
    chatty = [sys.executable, "-c", "import sys; sys.stderr.write('legato: step\\n' * 20_000)"]
    done = run_ranks(chatty, timeout=60)
    assert codes(done) == [0, 0] and all(len(p.stderr) == 13 * 20_000 for p in done)
