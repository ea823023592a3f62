"""Benchmark: a verified resume against a plain script's `torch.load` + `load_state_dict`, warm and cold, in one run.

The restore rows of bench_defaults.py alone, at every size and rank count the
goal names, each from its files in the page cache (warm) and from disk with the
page cache dropped (cold, as on a node that never read the checkpoint). For
each rank count (`--ranks`, gloo processes on this machine) and state size
(`--mb`: model + AdamW moments, as in bench_defaults.py), a live Session at
`replay_steps=0` is stopped by a real SIGUSR2 after its third step and rank 0
saves the same state with `torch.save` + fsync; then rounds of these rows
alternate, the median of each printed, the time of a row being the slowest
rank's:

- anchor: `torch.load` + `load_state_dict` of the whole state by every rank at
  once (what a DDP script's resume does), twice (A, B): the spread between the
  two is the run's noise floor;
- legato: a Session's resume with replay off, `session.resumed.seconds` (select
  and verify the newest checkpoint, load it, restore it, recompute the live
  state's digests and compare them with the manifest's), and the same Session's
  start to its first batch (which adds what every start does, resumed or not:
  the census of unsaved state);
- `torch.load` + `load_state_dict` by rank 0 alone;
- a raw read of the whole `torch.save` file by every rank (the disk's or the page
  cache's floor of any load).

Replay is off because a replay re-runs training steps: its cost is a step's, not
a restore's (bench_replay.py measures it). Every row waits `--settle` seconds
before it, outside its timing, as in bench_defaults.py (a VM's free page
reporting makes memory returned to the host slow to fill again), and collects the
bench's own garbage after it: the Sessions of earlier rows, left in reference
cycles, would otherwise make the next Session's census of unsaved state confirm
them with a full collection, which a resuming script does not have.

    python benchmarks/bench_restore.py [--ranks 2 4] [--mb 256 1024] [--rounds 3] [--cache warm cold] [--dir /tmp]
                                       [--settle 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_defaults as defaults
import bench_device
import torch
import torch.distributed as dist

ANCHOR = "torch.load + load_state_dict, every rank (A)"
CONTROL = "torch.load + load_state_dict, every rank (B)"
RESUME = "legato resume, replay off (select, restore, verify)"
STARTED = "legato Session start to first batch, resuming"
RANK_0 = "torch.load + load_state_dict, rank 0"
RAW_READ = "raw read of the torch.save file, every rank"
CACHES = ("warm", "cold")
PIECE = 8 * 2**20


def raw_read(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(PIECE):
            pass


def worker(
    rank: int, world: int, port: int, megabytes: int, rounds: int, settle: float, caches: list[str], device: str, directory: str, out: dict
) -> None:
    defaults.DEVICE = bench_device.place(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = Path(directory)
    run_dir, saved = base / "legato", base / "A.pt"
    defaults.session_checkpoint(run_dir, megabytes, defaults.NO_REPLAY, True, 0.0)
    model, optimizer = defaults.make(megabytes)
    defaults.train_step(model, optimizer)
    defaults.ANCHORS.extend([model, optimizer])
    if rank == 0:
        defaults.torch_save_fsync({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    times: dict[str, list[float]] = {}

    def record(cache: str, name: str, seconds: float) -> None:
        times.setdefault(f"{cache} {name}", []).append(defaults.largest(seconds))
        gc.collect()  # the Sessions of earlier rows, left in reference cycles: no resuming script starts with them

    def prepared(path: Path, cache: str, wait: float) -> float:
        """The page cache as the row needs it, `wait` seconds for memory to settle, every rank at the line: the row's start."""
        if rank == 0:
            defaults.page_cache(path, cache == "cold")
        time.sleep(wait)
        dist.barrier()
        return time.perf_counter()

    def load(cache: str, name: str, path: Path | None) -> None:
        start = prepared(saved, cache, settle)
        defaults.load_into(path, model, optimizer)
        record(cache, name, time.perf_counter() - start)

    for _ in range(rounds):
        for cache in caches:
            load(cache, ANCHOR, saved)
            prepared(run_dir, cache, 0.0)
            # The Session's model and optimizer are new, as a resuming script's are: memory settles after they are made.
            resumed, started = defaults.session_restore(run_dir, megabytes, settle)
            record(cache, RESUME, resumed)
            record(cache, STARTED, started)
            load(cache, CONTROL, saved)
            load(cache, RANK_0, saved if rank == 0 else None)
            start = prepared(saved, cache, settle)
            raw_read(saved)
            record(cache, RAW_READ, time.perf_counter() - start)
    if rank == 0:
        out.update({name: statistics.median(values) for name, values in times.items()})
        out["bytes"] = sum(t.nbytes for t in [*model.state_dict().values(), *[v for s in optimizer.state.values() for v in s.values()]])
    dist.destroy_process_group()


def print_table(results: dict, caches: list[str], world: int) -> None:
    state = results.pop("bytes")
    print(f"\n{world} ranks, {state / 2**20:.0f} MiB state: seconds (ratio to {ANCHOR})")
    print(f"| {'row':<52} |" + "".join(f" {cache:>6} s | ratio |" for cache in caches))
    print(f"| {'-' * 52} |" + " -------- | ----- |" * len(caches))
    for name in (ANCHOR, CONTROL, RESUME, STARTED, RANK_0, RAW_READ):
        cells = ""
        for cache in caches:
            seconds, anchor = results[f"{cache} {name}"], results[f"{cache} {ANCHOR}"]
            cells += f" {seconds:8.3f} | {seconds / anchor:5.2f} |"
        print(f"| {name:<52} |{cells}")
    for cache in caches:
        ratio = results[f"{cache} {RESUME}"] / results[f"{cache} {ANCHOR}"]
        control = results[f"{cache} {CONTROL}"] / results[f"{cache} {ANCHOR}"]
        print(f"{cache}: resume / torch.load every rank {ratio:.2f}x (control B / A {control:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mb", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cache", choices=CACHES, nargs="+", default=list(CACHES), help="warm: files in the page cache; cold: dropped (root)"
    )
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--settle", type=float, default=defaults.SETTLE_S, help="seconds to wait before each row (0: none)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state lives (cuda: every rank on GPU 0)")
    args = parser.parse_args()
    if "cold" in args.cache and not os.access(defaults.DROP_CACHES, os.W_OK):
        print(
            f"--cache cold drops the page cache before each row, which takes writing {defaults.DROP_CACHES}: only root may. "
            "Run the bench as root, or with --cache warm.",
            file=sys.stderr,
        )
        sys.exit(2)
    bench_device.require(args.device)
    defaults.prepare_parent()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds, medians, {args.settle:g} s settle before each row")
    for world in args.ranks:
        for megabytes in args.mb:
            results = defaults.on_ranks(worker, world, args.dir, megabytes, args.rounds, args.settle, args.cache, args.device)
            print_table(results, args.cache, world)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
