"""Benchmark of a tensor digest's throughput, each way side by side with a memory copy of the same bytes on the same device.

The rows, per state size (one tensor of float32 of that many bytes, digested whole):

    memory copy (anchor)       `dst.copy_(src)` where the tensor lives: the floor any pass over the bytes meets
    memory copy (control)      the same again: how far this machine's noise moves a row
    XXH3 on the host           what a CPU tensor's digest is (legato.state.hashing); on a GPU, the bytes copied to
                               pinned host memory first, as every GPU digest was before the device rule
    block sums                 legato.state.checksum, how ranks compare replicated copies where they live
    device rule                legato.state.device_digest, what a GPU tensor's digest is (computed where it lives)

Ratios are each row's time over the anchor's in the same round, medians over the rounds. One process: a digest is one
rank's work on its own tensors, whatever the world size.

    python benchmarks/bench_digest.py [--mb 16 256 1024] [--rounds 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import bench_device
import torch

from legato.state.checksum import block_sums
from legato.state.device_digest import device_digest
from legato.state.hashing import raw_digest


def _host_xxh3(t: torch.Tensor) -> Callable[[], object]:
    if t.device.type == "cpu":
        return lambda: raw_digest(t.view(torch.uint8).numpy())
    landing = torch.empty(t.nbytes, dtype=torch.uint8, pin_memory=True)
    return lambda: raw_digest(landing.copy_(t.view(torch.uint8)).numpy())


def _rows(t: torch.Tensor) -> dict[str, Callable[[], object]]:
    dst = torch.empty_like(t)
    return {
        "memory copy (anchor)": lambda: dst.copy_(t),
        "memory copy (control)": lambda: dst.copy_(t),
        "XXH3 on the host": _host_xxh3(t),
        "block sums": lambda: block_sums(t),
        "device rule": lambda: device_digest(t),
    }


def _timed(run: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure(mb: int, rounds: int, device: torch.device) -> dict[str, tuple[float, float]]:
    """Each row's median seconds and median ratio to the anchor of its round."""
    t = torch.randn(mb * 2**20 // 4, generator=torch.Generator().manual_seed(0)).to(device)
    rows = _rows(t)
    for run in rows.values():  # warm-up: first allocations, the device rule's keys
        _timed(run, device)
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        anchor = _timed(rows["memory copy (anchor)"], device)
        seconds["memory copy (anchor)"].append(anchor)
        ratios["memory copy (anchor)"].append(1.0)
        for name, run in list(rows.items())[1:]:
            took = _timed(run, device)
            seconds[name].append(took)
            ratios[name].append(took / anchor)
    return {name: (statistics.median(seconds[name]), statistics.median(ratios[name])) for name in rows}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[16, 256, 1024], help="tensor sizes in MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the tensor lives")
    args = parser.parse_args(argv)
    bench_device.require(args.device)
    device = bench_device.place(args.device)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU"
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, the tensor on {where}")
    print(f"seconds and GiB/s: medians of {args.rounds} rounds; ratio: the row's time over the memory copy's in the same round")
    for mb in args.mb:
        print(f"{mb} MiB:")
        for name, (seconds, ratio) in measure(mb, args.rounds, device).items():
            print(f"   {name:<24} {seconds * 1e3:10.2f} ms {mb / 1024 / seconds:8.2f} GiB/s {ratio:8.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
