"""Per-step cost of a Session at its default settings, over a DataLoader with workers, measured side by side in one run.

What a user runs: a 2-rank gloo DDP loop over their own DataLoader (a DistributedSampler, `num_workers` worker
processes, a CIFAR-style augmentation drawing from python's and torch's RNGs in the workers), first plain and then
wrapped in `legato.Session` with nothing but the defaults (`CheckpointPolicy()`: a replay base every 32 steps or as its
cost allows, per-sample worker seeding, the hang watchdog). Variants that turn one default off (or, `hash_every_steps=10`,
the state hash on, the default before 2026-11-29) show where the cost goes.

Each block is one epoch of `--steps` steps in fresh iterators (workers start as they do at each epoch of a run
without persistent workers). A block's time runs from the second batch to the last, so it counts loading, training
and every step boundary but not the Session's start-up or its final checkpoint (measured elsewhere:
bench_defaults.py). Blocks of every variant alternate with a plain block, each is divided by the plain block run
just before it, and the medians are printed; the second plain row is the control that shows the noise floor.

With `--device cuda` the model trains on the GPU (every rank on the one GPU it is given; one rank uses NCCL, several
share the GPU over gloo) and the loaders pin their batches, which each step copies to the GPU without waiting; the
Session's `report(loss)` then reads the loss back, a wait for the GPU each step that the plain loop does not have.

    python benchmarks/bench_steps.py [--steps 96] [--rounds 8] [--workers 2] [--batch 32] [--variants defaults ...]
                                     [--world 2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import bench_device
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from legato.runtime.launch import free_port
from legato.session.policy import HangPolicy
from legato.session.session import CheckpointPolicy, Session

VARIANTS = ("defaults", "no-worker-rng", "hash-every-10", "no-replay", "no-watchdog")


class Augmented(Dataset):
    """Fixed uint8 images, cropped and flipped at random per sample, as a CIFAR training transform does."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 40, 40), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = self.images[i, :, top : top + 32, left : left + 32].float().div_(255)
        if random.random() < 0.5:
            image = image.flip(-1)
        return (image - 0.5) / 0.25, self.labels[i]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 8 * 8, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def _timed_epoch(
    batches: Iterable,
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    report: Callable | None,
    steps: int,
    sync: Callable[[], None],
) -> float:
    """Seconds per step between the second batch and the last (start-up and the end of the epoch excluded). `sync` waits
    for the GPU at those two batches only, so the steps between them queue their work as the loop would."""
    yielded: list[float] = []
    for x, y in batches:
        if len(yielded) in (1, steps - 1):
            sync()
        yielded.append(time.perf_counter())
        loss = step(x, y)
        if report is not None:
            report(loss)
    return (yielded[-1] - yielded[1]) / (len(yielded) - 2)


def _middle_half(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles: where the middle half of a row's rounds fell."""
    if len(values) < 2:
        return values[0], values[0]
    first, _, third = statistics.quantiles(values, n=4)
    return first, third


def _worker(rank: int, port: int, args: argparse.Namespace, tmp: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = bench_device.place(args.device)
    world = args.world
    dist.init_process_group(bench_device.backend(args.device, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    random.seed(0)
    dataset = Augmented(args.steps * args.batch * world)
    model = DDP(_model().to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def loader(epoch: int) -> DataLoader:
        sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=0, drop_last=True)
        sampler.set_epoch(epoch)
        return DataLoader(
            dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers, drop_last=True, pin_memory=device.type == "cuda"
        )

    def plain(r: int) -> float:
        dist.barrier()
        return _timed_epoch(loader(r), step, None, args.steps, sync)

    def session(label: str, policy: CheckpointPolicy, worker_rng: bool = True, hang: HangPolicy = HangPolicy()) -> Callable[[int], float]:
        def run(r: int) -> float:
            dist.barrier()
            s = Session(
                Path(tmp) / f"{label}-{r}",
                model=model,
                optimizer=opt,
                loader=loader(r),
                total_steps=args.steps,
                checkpoint=policy,
                worker_rng=worker_rng,
                hang=hang,
            )
            return _timed_epoch(s, step, s.report, args.steps, sync)

        return run

    every: dict[str, tuple[str, Callable[[int], float]]] = {
        "control": ("plain (control)", plain),
        "defaults": ("legato Session, defaults", session("defaults", CheckpointPolicy())),
        "no-worker-rng": ("  worker_rng=False", session("no-worker-rng", CheckpointPolicy(), worker_rng=False)),
        "hash-every-10": ("  hash_every_steps=10", session("hash-every-10", CheckpointPolicy(hash_every_steps=10))),
        "no-replay": ("  replay_steps=0", session("no-replay", CheckpointPolicy(replay_steps=0))),
        "no-watchdog": ("  hang watchdog off", session("no-watchdog", CheckpointPolicy(), hang=HangPolicy(watchdog=False))),
    }
    variants = dict(every[key] for key in ("control", *args.variants))
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    plain_times: list[float] = []
    for r in range(args.rounds + 1):  # round 0 warms up and is not counted
        before = plain(r)
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate so no variant always runs first
        measured = {name: variants[name](r) for name in names}
        if r:
            plain_times.append(before)
            for name, seconds in measured.items():
                ratios[name].append(seconds / before)
            if rank == 0:  # a run cut short (a lent machine's minutes) still shows the rounds it finished
                done = ", ".join(f"{name.strip()} {100 * (seconds / before - 1):+.1f}%" for name, seconds in measured.items())
                print(f"   round {r}/{args.rounds}: plain {before * 1e3:.3f} ms/step; {done}", flush=True)
    if rank == 0:
        base = statistics.median(plain_times)
        out["plain"] = (base, 1.0, 1.0, 1.0)
        out.update({name: (base * statistics.median(v), statistics.median(v), *_middle_half(v)) for name, v in ratios.items()})
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=96, help="steps a block (one epoch); >= 64 covers a replay base")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch")
    parser.add_argument("--world", type=int, default=2, help="ranks")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains (cuda: every rank on GPU 0)")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=VARIANTS,
        help="the Session rows to run beside the plain loop and its control (fewer rows: more rounds in the same time)",
    )
    args = parser.parse_args()
    bench_device.require(args.device)
    params = sum(p.numel() for p in _model().parameters())
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {bench_device.describe(args.device, args.world)}, 1 thread "
        f"each, {args.workers} workers a rank, batch {args.batch}, model {params / 1e6:.2f}M parameters + AdamW"
    )
    print(
        f"per-step time; overhead = median over {args.rounds} rounds of (variant block / adjacent plain block), {args.steps} steps a block"
    )
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), args, tmp, out), nprocs=args.world, join=True)
        for name, (seconds, ratio, first, third) in dict(out).items():
            print(
                f"   {name:<26} {seconds * 1e3:8.3f} ms/step   overhead {100 * (ratio - 1):+6.2f}%   "
                f"middle half of the rounds {100 * (first - 1):+6.2f}% .. {100 * (third - 1):+6.2f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
