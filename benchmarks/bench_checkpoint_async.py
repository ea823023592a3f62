"""Benchmark: what a checkpoint blocks, side by side in one run, per state size.

One rank (world size 1: on a 2-core machine a second rank would only measure
the two ranks fighting over the cores), a model + AdamW state of each size.
For every size, rounds of each variant alternate and the median is printed:

- memory copy of the state into a reused buffer (the floor of any async save);
- legato async: blocking part (the staging copy) and total (write, fsync,
  commit); legato sync (digest pass + barrier checkpoint);
- torch.save + fsync; DCP save; DCP async_save (blocking part and total);
- raw sequential write + fsync of the same number of bytes (the disk's floor);
- the per-step cost of a small training loop while an async write is in flight, with the other core
  idle and with it kept busy by a spinning process (two ranks on two cores, or a busy node: the
  writer thread then competes with the steps for CPU, and its low priority decides who waits);
- restore: legato (verify files, load, digest) vs torch.load;
- peak extra memory (the kernel's high-water mark: peak_memory.py) of legato async and DCP async_save;
- hash throughput per core: XXH3-128, SHA-256 and (when the blake3 package is installed) BLAKE3 on one
  thread, against a memory copy.

With `--device cuda` the state lives on the GPU: the memory copy and legato's
blocking part are then the device-to-pinned-host copy, and the training steps
run on the GPU.

    python benchmarks/bench_checkpoint_async.py [--mb 64 256] [--rounds 5] [--dir /tmp] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash

from legato.runtime.launch import free_port
from legato.state.hashing import Digests, digest, rank_hash
from legato.state.snapshot import Snapshot
from legato.store import checkpoint as ckpt
from legato.store import filehash
from legato.store.async_checkpoint import AsyncCheckpointer, Job
from legato.store.manifest import read_manifest

from peak_memory import PeakMemory

try:  # only for the comparison row; legato itself uses XXH3-128
    import blake3
except ImportError:
    blake3 = None


def make_state(megabytes: int, device: torch.device) -> dict:
    hidden = int((megabytes * 2**20 / 4 / 3) ** 0.5)  # params + two Adam moments = 3 copies
    model = torch.nn.Linear(hidden, hidden, bias=False, device=device)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, hidden, device=device)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def nbytes(state: dict) -> int:
    total = 0

    def walk(v: object) -> None:
        nonlocal total
        if isinstance(v, torch.Tensor):
            total += v.nbytes
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(state)
    return total


def fsync_write(path: Path, data: memoryview) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def legato_sync(state: dict, root: Path, step: int) -> None:
    seen = Digests()
    components = {name: digest(value, seen) for name, value in state.items()}
    share = ckpt.RankShare(0, {"rank0.pt": state}, components, rank_hash(components), seen=(seen,))
    ckpt.write_checkpoint(root, step, share, 1, None, {}, keep_last=1)


def legato_async(writer: AsyncCheckpointer, state: dict, step: int) -> tuple[float, float]:
    """(blocking seconds, total seconds until committed)."""
    start = time.perf_counter()
    staged = writer.stage(step, state, lambda: ({"rank0.pt": state}, set()))
    writer.start(Job(step, staged, staged.files, lambda: None, {}, (staged,), staged.copy_s))
    blocking = time.perf_counter() - start
    writer.finish()
    return blocking, time.perf_counter() - start


def dcp_async(state: dict, path: Path) -> tuple[float, float]:
    start = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=str(path))
    blocking = time.perf_counter() - start
    result = getattr(future, "upload_completion", future)
    result.result()
    return blocking, time.perf_counter() - start


def step_cost(writer: AsyncCheckpointer, state: dict, step: int, device: torch.device) -> tuple[float, float]:
    """Seconds per step of a small matmul loop, idle and while an async write of `state` is in flight."""
    torch.manual_seed(0)
    w = torch.randn(512, 512, device=device)
    x = torch.randn(256, 512, device=device)

    def steps(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            (x @ w).relu_().sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / n

    idle = steps(50)
    staged = writer.stage(step, state, lambda: ({"rank0.pt": state}, set()))
    writer.start(Job(step, staged, staged.files, lambda: None, {}, (staged,), staged.copy_s))
    busy, count = 0.0, 0
    while writer.in_flight is not None and not writer.in_flight.future.done():
        busy += steps(5)
        count += 1
    writer.finish()
    return idle, (busy / count if count else idle)


def step_cost_busy(writer: AsyncCheckpointer, state: dict, step: int, device: torch.device) -> tuple[float, float]:
    """`step_cost` while another process spins on a core (stopped by its pid afterwards)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        return step_cost(writer, state, step, device)
    finally:
        spinner.kill()
        spinner.wait()


def hash_speeds(size: int = 256 * 2**20) -> dict[str, float]:
    data = torch.randint(0, 255, (size,), dtype=torch.uint8)
    buf = memoryview(data.numpy())
    dst = torch.empty_like(data)
    out = {}
    variants = {
        "memory copy": lambda: dst.copy_(data),
        "XXH3-128": lambda: xxhash.xxh3_128_digest(buf),
        "SHA-256": lambda: hashlib.sha256(buf).digest(),
    }
    if blake3 is not None:
        variants["BLAKE3 (1 thread)"] = lambda: blake3.blake3(buf, max_threads=1).digest()
    for name, fn in variants.items():
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = size / min(times) / 1e9
    return out


def bench_size(megabytes: int, directory: Path, rounds: int, device: torch.device) -> dict[str, float]:
    state = make_state(megabytes, device)
    size = nbytes(state)
    raw = memoryview(os.urandom(size))
    buffer = Snapshot()
    root = directory / "legato_ckpt"
    writer = AsyncCheckpointer(directory / "legato_async", 0, 1, None, keep_last=1, kill=None)
    times: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    def timed(fn, *args: object, **kwargs: object) -> float:
        start = time.perf_counter()
        fn(*args, **kwargs)
        return time.perf_counter() - start

    memory: dict[str, int] = {}
    for r in range(rounds + 1):  # round 0 warms up (allocates the staging buffer) and is not counted
        results = {
            "memory copy of the state": timed(buffer.take, r, state, {"rank0.pt": state}, set()),
            "raw write + fsync": timed(fsync_write, directory / "raw.bin", raw),
            "torch.save + fsync": timed(torch_save_fsync, state, directory / "ts.pt"),
            "legato sync (barrier checkpoint)": timed(legato_sync, state, root, r + 1),
            "DCP save": timed(dcp.save, state, checkpoint_id=str(directory / f"dcp{r}")),
        }
        with PeakMemory() as rss:
            blocking, total = legato_async(writer, state, r + 1)
        memory["legato async"] = max(memory.get("legato async", 0), rss.extra)
        results["legato async: blocking"], results["legato async: total"] = blocking, total
        with PeakMemory() as rss:
            blocking, total = dcp_async(state, directory / f"dcpa{r}")
        memory["DCP async_save"] = max(memory.get("DCP async_save", 0), rss.extra)
        results["DCP async_save: blocking"], results["DCP async_save: total"] = blocking, total
        idle, busy = step_cost(writer, state, 1000 + r, device)
        results["step, idle"], results["step, async write in flight"] = idle, busy
        idle, busy = step_cost_busy(writer, state, 2000 + r, device)
        results["step, other core busy, idle"], results["step, other core busy, write in flight"] = idle, busy
        published = sorted((directory / "legato_async").glob("step_*"))[-1]
        results["restore: legato (verify + load + digest)"] = timed(_legato_restore, published)
        results["restore: torch.load"] = timed(torch.load, directory / "ts.pt", weights_only=True)
        for p in directory.glob("dcp*"):
            shutil.rmtree(p)
        if r:
            for name, seconds in results.items():
                record(name, seconds)
    writer.close()
    out = {name: statistics.median(v) for name, v in times.items()}
    out["_bytes"] = size
    out.update({f"_peak extra memory, {k}": v for k, v in memory.items()})
    return out


def torch_save_fsync(state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _legato_restore(path: Path) -> None:
    manifest = read_manifest(path)
    loaded = filehash.load_file(path / "rank0.pt")
    digest(loaded)
    assert manifest["step"] >= 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"), help="where the state lives: cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} torch thread, world size 1")
    if args.device.type == "cuda":
        print(f"state on {torch.cuda.get_device_name(args.device)} (CUDA {torch.version.cuda}); copies go to pinned host memory")
    print("hash throughput, GB/s on one core:", ", ".join(f"{k} {v:.2f}" for k, v in hash_speeds().items()))
    results = {}
    for mb in args.mb:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            results[mb] = bench_size(mb, Path(tmp), args.rounds, args.device)
    names = [n for n in results[args.mb[0]] if not n.startswith("_")]
    print(f"\nmedians of {args.rounds} rounds, seconds (step rows: seconds per step)")
    print(f"{'':44}" + "".join(f"{f'{mb} MiB':>12}" for mb in args.mb))
    for name in names:
        print(f"{name:44}" + "".join(f"{results[mb][name]:12.4f}" for mb in args.mb))
    for mb in args.mb:
        r = results[mb]
        mem = ", ".join(f"{k.removeprefix('_peak extra memory, ')} {v / r['_bytes']:.2f}x" for k, v in r.items() if k.startswith("_peak"))
        print(
            f"\n{mb} MiB ({r['_bytes'] / 2**20:.0f} MiB of tensors): async blocking / memory copy "
            f"{r['legato async: blocking'] / r['memory copy of the state']:.2f}; async blocking / sync "
            f"{r['legato async: blocking'] / r['legato sync (barrier checkpoint)']:.3f}; sync / torch.save+fsync "
            f"{r['legato sync (barrier checkpoint)'] / r['torch.save + fsync']:.2f}; async total / raw write+fsync "
            f"{r['legato async: total'] / r['raw write + fsync']:.2f}; step slowdown while writing "
            f"{r['step, async write in flight'] / r['step, idle']:.2f}x (other core busy: "
            f"{r['step, other core busy, write in flight'] / r['step, other core busy, idle']:.2f}x); peak extra memory / state: {mem}"
        )
        # What a checkpoint costs the training: sync blocks for all of it; async blocks for the copy, and the
        # steps that run during the background write are slower (both share the cores).
        lost = r["legato async: total"] * (1 - r["step, idle"] / r["step, async write in flight"])
        print(
            f"{mb} MiB: training time lost per checkpoint: sync {r['legato sync (barrier checkpoint)']:.3f}s, "
            f"async {r['legato async: blocking'] + lost:.3f}s ({r['legato async: blocking']:.3f}s blocking + {lost:.3f}s of slower steps)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
