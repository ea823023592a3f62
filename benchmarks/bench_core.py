"""Benchmark of the exact-resume core, measured side by side in one run.

1. Per-step cost of the agreed stop: a 2-rank gloo DDP loop (and a second
   plain block as a control, which shows the noise floor), the same loop
   with an all-reduce at every step, the same with the default auto-spaced
   agreement, and the same loop under a full Session (agreed stop, trajectory
   line per step, no checkpoints). Short blocks of each variant alternate and
   each is compared with the plain block run just before it, so the drift of a
   shared machine cancels out.
2. Checkpoint write throughput for one state (model + AdamW): legato's barrier
   checkpoint (SHA-256, fsync, manifest, atomic rename), plain torch.save,
   torch.save followed by fsync, and raw bytes written and fsynced.

    python benchmarks/bench_core.py [--steps 60] [--rounds 15] [--mb 256] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.dist.stop import StopAgreement
from legato.runtime.launch import free_port
from legato.session.session import CheckpointPolicy, Session, resumable_loader
from legato.state.hashing import digest, rank_hash
from legato.store import checkpoint as ckpt


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)
    )


def _loop_worker(rank: int, port: int, steps: int, rounds: int, tmp: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64 * 2 * steps, 256), torch.randn(64 * 2 * steps, 1))
    model = DDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    control = dist.new_group(backend="gloo")
    agreements = {"agreed stop (every step)": StopAgreement(control, every_steps=1), "agreed stop (auto)": StopAgreement(control)}
    ratios: dict[str, list[float]] = {name: [] for name in [*agreements, "session (auto)"]}
    plain_times: list[float] = []
    done = 0

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def block(agreement: StopAgreement | None) -> float:
        nonlocal done
        loader = resumable_loader(data, 64, seed=done, rank=rank, world_size=2)
        dist.barrier()
        start = time.perf_counter()
        for x, y in loader:
            step(x, y)
            done += 1
            if agreement is not None:
                agreement.boundary(done, False, False)
        return (time.perf_counter() - start) / steps

    def session_block(r: int) -> float:
        loader = resumable_loader(data, 64, seed=r, rank=rank, world_size=2)
        dist.barrier()
        start = time.perf_counter()
        session = Session(
            Path(tmp) / f"run{r}",
            model=model,
            optimizer=opt,
            loader=loader,
            total_steps=steps,
            checkpoint=CheckpointPolicy(hash_every_steps=0),
        )
        for x, y in session:
            session.report(step(x, y))
        # The session ends with one final checkpoint; checkpoint cost is measured separately.
        return (time.perf_counter() - start - session.last_checkpoint.seconds) / steps

    variants = {
        "plain (control)": lambda r: block(None),
        **{n: (lambda r, a=a: block(a)) for n, a in agreements.items()},
        "session (auto)": session_block,
    }
    ratios["plain (control)"] = []
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        plain = block(None)
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate so no variant always runs first
        measured = {name: variants[name](r) for name in names}
        if r:
            plain_times.append(plain)
            for name, seconds in measured.items():
                ratios[name].append(seconds / plain)
    for agreement in agreements.values():
        agreement.drain()
    if rank == 0:
        out["plain"] = (statistics.median(plain_times), 1.0)
        out.update({name: (statistics.median(plain_times) * statistics.median(r), statistics.median(r)) for name, r in ratios.items()})
    dist.destroy_process_group()


def bench_loop(steps: int, rounds: int) -> dict[str, float]:
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        out = manager.dict()
        mp.spawn(_loop_worker, args=(free_port(), steps, rounds, tmp, out), nprocs=2, join=True)
        return dict(out)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _fsync_write(path: Path, data: bytes | memoryview) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def bench_checkpoint(megabytes: int, directory: Path, repeats: int) -> tuple[int, dict[str, float]]:
    hidden = int((megabytes * 2**20 / 4 / 3) ** 0.5)  # params + two Adam moments = 3 copies
    model = torch.nn.Linear(hidden, hidden, bias=False)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, hidden)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    components = {name: digest(value) for name, value in state.items()}
    share = ckpt.RankShare(0, {"rank0.pt": state}, components, rank_hash(components))
    size = sum(t.numel() * t.element_size() for t in [model.weight, *opt.state[model.weight].values()])
    raw = os.urandom(size)
    root = directory / "bench_ckpt"
    results: dict[str, list[float]] = {"legato barrier checkpoint": [], "torch.save": [], "torch.save + fsync": [], "raw write + fsync": []}
    for i in range(repeats):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        results["legato barrier checkpoint"].append(_timed(lambda i=i: ckpt.write_checkpoint(root, i, share, 1, None, {}, keep_last=1)))
        results["torch.save"].append(_timed(lambda: torch.save(state, root / "plain.pt")))

        def save_fsync() -> None:
            torch.save(state, root / "plain_fsync.pt")
            fd = os.open(root / "plain_fsync.pt", os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

        results["torch.save + fsync"].append(_timed(save_fsync))
        results["raw write + fsync"].append(_timed(lambda: _fsync_write(root / "raw.bin", raw)))
    shutil.rmtree(root, ignore_errors=True)
    return size, {k: statistics.median(v) for k, v in results.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--mb", type=int, default=256, help="checkpoint state size in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, checkpoint dir {args.dir}")
    print(
        f"\n1. per-step time, 2 ranks gloo; overhead = median over {args.rounds} cycles of (variant block / adjacent plain block), "
        f"{args.steps} steps a block"
    )
    loop = bench_loop(args.steps, args.rounds)
    for name, (seconds, ratio) in loop.items():
        print(f"   {name:<26} {seconds * 1e3:8.3f} ms/step   overhead {100 * (ratio - 1):+6.2f}%")

    size, ck = bench_checkpoint(args.mb, args.dir, args.repeats)
    print(f"\n2. checkpoint write of {size / 2**20:.0f} MiB (model + AdamW), median of {args.repeats}")
    raw = ck["raw write + fsync"]
    for name, seconds in ck.items():
        print(f"   {name:<26} {seconds:7.3f} s  {size / 2**20 / seconds:8.1f} MiB/s   {raw / seconds:5.2f}x raw disk speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
