"""Benchmark of legato's bucket layout handling against DDP's own, measured side by side in one run.

An uninterrupted run under legato keeps DDP's own layout, so its steps cost
what the plain loop's do; what legato adds is reading the rebuilt layout once
per process (at the first capture after DDP's rebuild) and, on a resume,
building DDP's reducer again with the saved layout. Each rank holds three
copies of one model, each under its own DDP wrapper: DDP's own layout
(`plain`), a second one as a control (`plain (control)`, the noise floor of
the machine), and one given the plain wrapper's rebuilt layout before its
first step, as a resume does (`restored`). Short blocks of each alternate,
and each block is compared with the plain block run just before it, so the
drift of a shared machine cancels out. The model has several buckets (first
bucket 1 MiB, then 25 MiB). The one-off costs are timed on rank 0.

With `--device cuda` the model trains on the GPU, every rank on the one GPU it
is given: one rank over NCCL (DDP's own path on a GPU), several over gloo.

    python benchmarks/bench_reduction.py [--world 4] [--steps 20] [--rounds 10] [--hidden 1024] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import bench_device
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.dist.reduction import BucketLayout
from legato.runtime.launch import free_port

VARIANTS = ("plain (control)", "restored")


def _model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, hidden), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1))


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = bench_device.place(args.device)
    dist.init_process_group(bench_device.backend(args.device, world), rank=rank, world_size=world)
    nets = {name: DDP(_model(args.hidden).to(device)) for name in ("plain", "plain (control)", "restored")}
    opts = {name: torch.optim.SGD(net.parameters(), lr=1e-4) for name, net in nets.items()}
    x, y = torch.randn(32, 256, device=device), torch.randn(32, 1, device=device)
    opts["plain"].zero_grad(set_to_none=True)
    F.mse_loss(nets["plain"](x), y).backward()  # DDP rebuilds its buckets after this first backward pass
    start = time.perf_counter()
    layout = BucketLayout(nets["plain"]).state_dict()
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    BucketLayout(nets["restored"]).load_state_dict(layout)
    restore_s = time.perf_counter() - start

    def block(name: str) -> float:
        net, opt = nets[name], opts[name]
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            F.mse_loss(net(x), y).backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / args.steps

    for name in nets:  # warm-up: the first step of each wrapper rebuilds its buckets
        block(name)
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    plain: list[float] = []
    for _ in range(args.rounds):
        for name in VARIANTS:
            base = block("plain")
            plain.append(base)
            ratios[name].append(block(name) / base)
    if rank == 0:
        out["read_s"], out["restore_s"], out["n_buckets"] = read_s, restore_s, len(layout["buckets"])
        out["plain"] = statistics.median(plain)
        out["buckets"] = {name: net._get_ddp_logging_data().get("rebuilt_bucket_sizes", "?") for name, net in nets.items()}
        for name in VARIANTS:
            out[name] = statistics.median(ratios[name])
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains (cuda: every rank on GPU 0)")
    args = parser.parse_args(argv)
    bench_device.require(args.device)
    params = sum(p.numel() for p in _model(args.hidden).parameters())
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, {bench_device.describe(args.device, args.world)}, 1 thread "
        f"each, model {params / 1e6:.2f}M parameters ({params * 4 / 2**20:.1f} MiB of gradients)"
    )
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(args.world, free_port(), args, out), nprocs=args.world, join=True)
        result = dict(out)
    print(
        f"per-step time; overhead = median over {args.rounds} rounds of (variant block / adjacent plain block), {args.steps} steps a block"
    )
    print(
        f"   {'plain (DDP layout)':<22} {result['plain'] * 1e3:9.3f} ms/step   overhead  +0.00%   buckets (bytes) "
        f"{result['buckets']['plain']}"
    )
    for name in VARIANTS:
        ratio = result[name]
        label = "restored (legato)" if name == "restored" else name
        print(
            f"   {label:<22} {result['plain'] * ratio * 1e3:9.3f} ms/step   overhead {100 * (ratio - 1):+6.2f}%   buckets (bytes) "
            f"{result['buckets'][name]}"
        )
    print(
        f"one-off, rank 0: reading the rebuilt layout ({result['n_buckets']} buckets) {result['read_s'] * 1e3:.2f} ms once per "
        f"process; restoring it on a resume {result['restore_s'] * 1e3:.2f} ms once per attempt"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
