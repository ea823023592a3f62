"""Benchmark: checkpoints as users run them, live Sessions at their default settings, side by side in one run.

For each rank count (`--ranks`, gloo processes on this machine) and state size
(`--mb`: model + AdamW moments, `Linear(h, h)` so the model is a third of it),
rounds of every variant alternate and the median of each is printed, the time
of a collective variant being the slowest rank's:

- control: `torch.save` + fsync of the whole state by rank 0, twice (plain A,
  plain B): the spread between the two is the noise floor of the run;
- legato: a live Session at its defaults, stopped by a real SIGUSR2 after its
  third step; the time is what the loop sees of the stopping step (the digest
  pass and the barrier checkpoint) less a normal step; at the defaults the stop
  checkpoint writes its replay base only (its state is held by its replay).
  Again with `verify="warn"` (the stop writes its own state and its base, as
  every stop did before), with `replay_steps=0` (no replay base), with `replay_steps=2` (a base of step 2 that holds
  every component, AdamW's moments included: what a stop in a long run writes when its base is a snapshot taken
  between checkpoints; the base of step 0 of the defaults row holds the model alone, as AdamW has no moments
  before its first step), and with `async_=True` the steps of two periodic checkpoints: the attempt's first (step 3:
  it also runs the census of unsaved state and allocates the staging buffer) and the next (step 6, once the first
  is written and committed: the blocking part of every later one, the staging copy; the commit, rank 0 publishing
  the manifest at an agreed step after the write, is in neither); a snapshot's step is not counted as a normal
  step. Their MiB column is what the checkpoint wrote. The second one's background write (the worker thread's hash,
  write, fsync and report of the rank's share, from the end of the staging copy, while the loop trains on) is a row
  of its own, and so is a third checkpoint's (step 9), whose write the loop waits for: the write alone. Their ratios
  to a raw write of the bytes each rank wrote in it are printed under the table;
- DCP `save` and `async_save` (blocking part, and total until durable);
- raw write + fsync of the bytes of one rank's share (state / ranks), every rank at once (the disk's floor for a spread
  write), of as many bytes as each rank wrote in the async run's waited checkpoint (the floor of its background write:
  the spread goes by whole tensors), and of the whole state by one rank, in 256 KiB writes (one write of a whole
  buffer costs 4-5x on a VM that gives freed memory back to its host: docs/benchmarks-log.md, "Writes in pieces");
- a memory copy of the state, of one rank's share of it (state / ranks), and of the largest share a rank wrote in the
  async run (the spread goes by whole tensors, so one rank may stage more than state / ranks): the floors of a
  blocking part;
- peak memory: each rank's peak resident memory over a whole run (its model, steps and checkpoints) of each stop
  variant, of the async one, and of the same DDP loop without legato that saves with `torch.save` + fsync (rank 0) or
  DCP `save` at the stop step, above that of the plain loop that never saves (the largest rank's, as a share of the
  state). The kernel's own high-water mark, reset before each run (`/proc/self/clear_refs`), so nothing is sampled and
  nothing is missed; the bench has glibc give every freed tensor back at once (MALLOC_MMAP_THRESHOLD_), so no run
  reuses memory an earlier one left in the allocator;
- restore: a Session's resume with replay off (select and verify the newest checkpoint, load it, check its digests:
  `session.resumed.seconds`) against `torch.load` + `load_state_dict` of the whole state by rank 0 alone, and by every
  rank at once (what a DDP script's resume does, and what every rank of a Session loads); and the same Session's
  start to its first batch, which adds what every start does, resumed or not (the census of unsaved state). Each
  restore row starts with its files in the page cache (read once before it), or with `--cold` (root) with the page
  cache dropped, as on a node that never read the checkpoint: never with whatever the rows before it happened to leave.

Between variants the bench collects its own garbage (outside the timings): the Sessions of earlier variants, left in
reference cycles, would otherwise be found by the next census's collector sweep and cost it a full collection, which a
training process does not have.

Every timed part starts from the same memory state: the bench waits `--settle` seconds (outside the timings) right
before it. A virtual machine that reports free pages to its host (Linux free page reporting, 2 s after pages are
freed; this project's machines do) makes a write or an allocation into returned pages cost 4-8x the CPU of one into
pages freed a moment ago, so without the wait a variant that ran right after the previous one's files were deleted
measured up to 4x faster than one that ran seconds later. A checkpoint minutes after the last one meets settled memory.

With `--device cuda` the state lives on the GPU (every rank on the one GPU it is given, the collectives over gloo,
as ranks that share a GPU run): the memory copies are then copies from the GPU into pinned host memory, the floor of
a blocking part that stages there, and the peak memory rows count host memory only.

    python benchmarks/bench_defaults.py [--ranks 2 4] [--mb 64 256 1024] [--rounds 3] [--dir /tmp] [--settle 3] [--cold]
                                        [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_device
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import legato
from legato.files import write_in_pieces
from legato.paths import CHECKPOINT_MANIFEST, RunPaths
from legato.runtime.launch import free_port
from legato.store.async_checkpoint import AsyncCheckpointer

from peak_memory import PeakMemory

STEPS = 6
STOP_AFTER = 3
SETTLE_S = 3.0  # free page reporting acts 2 s after pages are freed
ANCHORS: list[object] = []  # the bench's own model and optimizer, which no Session saves: its census is told so
# The defaults, except that the ranks agree at every step (the default spaces agreements about 1 s apart, and these
# runs are a few steps long); the agreement's cadence changes when a stop lands, not what a checkpoint costs.
DEFAULTS = legato.CheckpointPolicy(agree_every_steps=1)
NO_REPLAY = legato.CheckpointPolicy(agree_every_steps=1, replay_steps=0)
WARN = legato.CheckpointPolicy(agree_every_steps=1, verify="warn")  # a stop that writes its own state and its base: 2x
ASYNC = legato.CheckpointPolicy(agree_every_steps=1, async_=True, every_steps=3)
ASYNC_STEPS = 12  # periodic at steps 3, 6 and 9 (12 is the final); the first one commits at step 4 or 5, between them
WAITED = 9  # the periodic checkpoint whose write the loop waits for before it trains on: the write's own time
FULL_BASE = legato.CheckpointPolicy(agree_every_steps=1, replay_steps=2)  # the base of step 2 holds AdamW's moments too
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
DEVICE = torch.device("cpu")  # where each rank's state lives: set once per process by worker()
PLAIN = "plain loop, no checkpoint"  # the memory rows' reference
BACKGROUND = "legato Session async_=True, background write"
BACKGROUND_ALONE = "  the same, the loop waiting (the write alone)"
RAW_SHARE = "raw write + fsync, each rank its share"
RAW_WRITTEN = "raw write + fsync, each rank the bytes it wrote async"
Save = Callable[[torch.nn.Module, torch.optim.Optimizer], None]  # how a plain loop saves at its stop
STOPS = (  # row, run directory, policy of the stop-checkpoint variants
    ("legato Session, defaults (stop checkpoint)", "legato", DEFAULTS),
    ("legato Session, verify=warn (state + base)", "warn", WARN),
    ("legato Session, replay_steps=0", "noreplay", NO_REPLAY),
    ("legato Session, replay_steps=2 (stop, full base)", "fullbase", FULL_BASE),
)


def make(megabytes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    hidden = int((megabytes * 2**20 / 4 / 3) ** 0.5)
    model = torch.nn.Linear(hidden, hidden, bias=False, device=DEVICE)
    optimizer = torch.optim.AdamW(model.parameters())
    return model, optimizer


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    features = getattr(model, "module", model).in_features
    loss = model(torch.ones(2, features, device=DEVICE)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def largest(number: float) -> float:
    """The largest of every rank's `number`."""
    value = torch.tensor([number], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value[0])


@dataclass
class Checkpointed:
    """One checkpoint of a live Session as the bench saw it."""

    seconds: float  # what the loop saw of its step, less the median other step
    written: int  # bytes of its own files
    background: float | None = None  # async: this rank's write after the staging copy (hash, write, fsync, report)


def session_checkpoint(run_dir: Path, megabytes: int, policy: legato.CheckpointPolicy, stop: bool, settle: float) -> Checkpointed:
    """What the loop sees of the checkpoint step of a live Session, less its median other step; and the bytes it wrote."""
    return checkpoint_steps(run_dir, megabytes, policy, stop, settle)[0]


def checkpoint_steps(
    run_dir: Path, megabytes: int, policy: legato.CheckpointPolicy, stop: bool, settle: float, total: int = STEPS, waited: int | None = None
) -> list[Checkpointed]:
    """What the loop sees of each checkpoint step of a live Session (the stop's, or every periodic one), less its median
    other step, and the bytes each wrote. An asynchronous checkpoint's write is waited for outside the timed steps (a
    private attribute: the Session tells no one), so that the next one's step is its own blocking part, not a wait for
    the previous write, which checkpoints minutes apart never have; the write's own time, from the end of the staging
    copy until the worker thread's future is done, is kept as `background`. After step `waited` the loop waits for that
    write, and every rank for every other's, before it trains on, so its `background` is the write alone, with no training
    beside it."""
    model, optimizer = make(megabytes)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    chaos = legato.Chaos(signal_rank=dist.get_world_size() - 1, signal_at_steps=(STOP_AFTER - 1,)) if stop else legato.Chaos()
    session = legato.Session(run_dir, model=ddp, optimizer=optimizer, total_steps=total, checkpoint=policy, chaos=chaos, ignore=ANCHORS)
    due = {STOP_AFTER} if stop else set(range(policy.every_steps, total, policy.every_steps))
    gaps, it = [], iter(session)
    writes: dict[int, float] = {}  # step -> its asynchronous write's seconds after the staging copy
    while True:
        if len(gaps) in due:
            time.sleep(settle)
        start = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            gaps.append(time.perf_counter() - start)
            break
        gaps.append(time.perf_counter() - start)
        writer = session._saving.periodic
        flight = writer.in_flight if isinstance(writer, AsyncCheckpointer) else None
        if flight is not None and flight.job.step not in writes:
            writes[flight.job.step] = math.nan
            flight.future.add_done_callback(functools.partial(_stamp, writes, flight.job.step, flight.started + flight.job.blocking_s))
            if flight.job.step == waited:
                flight.future.exception()
                dist.barrier()  # no rank trains on beside another's write
        session.report(train_step(ddp, optimizer))
        while writer.votes().get("writing_local"):
            time.sleep(0.01)
    steps = (
        [session.last_checkpoint.step]
        if stop and session.last_checkpoint is not None
        else list(range(policy.every_steps, total, policy.every_steps))
    )
    # gaps[i] ends step i (gaps[0] is the start-up); the checkpoints are at `steps`; a step that took a snapshot is no normal step.
    snapshots = {i for i in range(len(gaps)) if policy.replay_steps and i % policy.replay_steps == 0}
    others = [g for i, g in enumerate(gaps[1:], start=1) if i not in steps and i < len(gaps) - 1 and i not in snapshots] or [0.0]
    return [Checkpointed(gaps[step] - statistics.median(others), written_by(run_dir, step), writes.get(step)) for step in steps]


def _stamp(writes: dict[int, float], step: int, since: float, _: object) -> None:
    writes[step] = time.perf_counter() - since


def manifest_of(run_dir: Path, step: int) -> dict:
    return json.loads((RunPaths(run_dir).checkpoint(step) / CHECKPOINT_MANIFEST).read_text())


def largest_share(run_dir: Path, step: int) -> int:
    """The bytes of the files the rank that wrote the most of `step`'s checkpoint wrote: what that rank stages."""
    manifest = manifest_of(run_dir, step)
    return max(sum(manifest["files"][f]["bytes"] for f in r["wrote"]) for r in manifest["ranks"])


def share_written(run_dir: Path, step: int, rank: int) -> int:
    """The bytes of the files rank `rank` wrote for `step`'s checkpoint."""
    manifest = manifest_of(run_dir, step)
    entry = next(r for r in manifest["ranks"] if r["rank"] == rank)
    return sum(manifest["files"][f]["bytes"] for f in entry["wrote"])


def written_by(run_dir: Path, step: int) -> int:
    """The bytes of the checkpoint of `step`'s own files, not a base on disk it refers to."""
    return sum(f["bytes"] for f in manifest_of(run_dir, step)["files"].values())


def session_restore(run_dir: Path, megabytes: int, settle: float) -> tuple[float, float]:
    """A resume with replay off: (select and verify the newest checkpoint, load it, check its digests; the Session's start to
    its first batch)."""
    model, optimizer = make(megabytes)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    session = legato.Session(run_dir, model=ddp, optimizer=optimizer, total_steps=STEPS, checkpoint=NO_REPLAY, ignore=ANCHORS)
    time.sleep(settle)
    start = time.perf_counter()
    it = iter(session)
    next(it)
    seconds = time.perf_counter() - start
    it.close()
    assert session.resumed is not None and session.resumed.match
    return session.resumed.seconds, seconds


def page_cache(path: Path, cold: bool) -> None:
    """Every restore row starts from the same page cache: the files under `path` read once, so all of them are cached;
    or (`cold`) every clean page dropped, as on a node that has never read the checkpoint."""
    if cold:
        os.sync()
        DROP_CACHES.write_text("3")
        return
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb", buffering=0) as f:
            while f.read(8 * 2**20):
                pass


def plain_loop(megabytes: int, save: Save | None) -> None:
    """The benchmark's DDP loop without legato up to the stop step, then `save(model, optimizer)` (None: no save)."""
    model, optimizer = make(megabytes)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for _ in range(STOP_AFTER):
        train_step(ddp, optimizer)
    if save is not None:
        save(model, optimizer)


def torch_save_fsync(state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def raw_write(path: Path, data: memoryview) -> None:
    with open(path, "wb") as f:
        write_in_pieces(f, data)  # the disk's floor, written as fast as this machine writes
        f.flush()
        os.fsync(f.fileno())


def host_buffer(like: torch.Tensor) -> torch.Tensor:
    """Where a copy of `like` goes: beside it on the CPU, pinned host memory for a tensor on the GPU."""
    if like.device.type == "cpu":
        return torch.empty_like(like)
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)


def copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy every source into its target, waiting for the GPU's copies to finish."""
    for target, source in zip(targets, sources):
        target.copy_(source, non_blocking=True)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def load_into(path: Path | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A plain script's resume: torch.load of the whole state and load_state_dict (nothing where `path` is None)."""
    if path is None:
        return
    loaded = torch.load(path, weights_only=True)
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])


def worker(
    rank: int, world: int, port: int, megabytes: int, rounds: int, settle: float, cold: bool, device: str, directory: str, out: dict
) -> None:
    global DEVICE
    DEVICE = bench_device.place(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = Path(directory)
    times: dict[str, list[float]] = {}
    written: dict[str, int] = {}
    peaks: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(largest(seconds))  # the slowest rank's
        gc.collect()

    def record_session(name: str, measured: Checkpointed) -> None:
        record(name, measured.seconds)
        written[name] = measured.written

    def peak(name: str, fn: Callable[..., Any], *args: object) -> Any:
        """Run `fn` (a whole run: its model, its steps and its checkpoints) and keep the largest rank's peak memory."""
        with PeakMemory() as memory:
            result = fn(*args)
        peaks.setdefault(name, []).append(largest(float(memory.extra)))
        return result

    def saved_by_rank_0(path: Path) -> Save:
        def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
            if rank == 0:
                torch_save_fsync({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

        return save

    def saved_by_dcp(path: Path) -> Save:
        def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
            dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(path))

        return save

    def go() -> float:
        """The start of a timed part: memory settled, every rank at the line."""
        time.sleep(settle)
        dist.barrier()
        return time.perf_counter()

    def cache(path: Path) -> None:
        """Before a restore row: its files in the page cache, or nothing there (`cold`), whatever the rows before left."""
        if rank == 0:
            page_cache(path, cold)
        dist.barrier()

    def timed(fn, *args: object, **kwargs: object) -> float:
        start = go()
        fn(*args, **kwargs)
        return time.perf_counter() - start

    model, optimizer = make(megabytes)
    train_step(model, optimizer)
    ANCHORS.extend([model, optimizer])
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    total = sum(t.nbytes for t in [*model.state_dict().values(), *[v for s in optimizer.state.values() for v in s.values()]])
    tensors = [*model.state_dict().values(), *[v for s in optimizer.state.values() for v in s.values() if v.dim()]]
    copies = [host_buffer(t) for t in tensors]
    share_source = torch.ones(total // world, dtype=torch.uint8, device=DEVICE)
    share_copy = host_buffer(share_source)
    # The raw writes' bytes, allocated outside their timings.
    share_bytes = memoryview(torch.ones(total // world, dtype=torch.uint8).numpy())
    all_bytes = memoryview(bytearray(total))
    for r in range(rounds):
        scratch = base / f"r{r}"
        if rank == 0:
            scratch.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        for label in ("plain A", "plain B"):
            record(
                f"control: torch.save + fsync, rank 0 ({label})",
                timed(torch_save_fsync, state, scratch / f"{label[-1]}.pt") if rank == 0 else timed(lambda: None),
            )
        peak(PLAIN, plain_loop, megabytes, None)
        peak("plain loop, torch.save + fsync at the stop (rank 0)", plain_loop, megabytes, saved_by_rank_0(scratch / "peak.pt"))
        peak("plain loop, DCP save at the stop", plain_loop, megabytes, saved_by_dcp(scratch / "peak_dcp"))
        for name, run, policy in STOPS:
            record_session(name, peak(name, session_checkpoint, scratch / run, megabytes, policy, True, settle))
        first, later, alone = peak(
            "legato Session async_=True (three periodic, final)",
            checkpoint_steps,
            scratch / "async",
            megabytes,
            ASYNC,
            False,
            settle,
            ASYNC_STEPS,
            WAITED,
        )
        record_session("legato Session async_=True, first periodic", first)
        record_session("legato Session async_=True, blocking (periodic)", later)
        record(BACKGROUND, later.background)
        record(BACKGROUND_ALONE, alone.background)
        record("DCP save", timed(dcp.save, state, checkpoint_id=str(scratch / "dcp")))
        start = go()
        future = dcp.async_save(state, checkpoint_id=str(scratch / "dcp_async"))
        blocking = time.perf_counter() - start
        future.result()
        record("DCP async_save, blocking", blocking)
        record("DCP async_save, total", time.perf_counter() - start)
        record(RAW_SHARE, timed(raw_write, scratch / f"raw{rank}", share_bytes))
        # The background write's floor: each rank's own bytes of that checkpoint, written at once by every rank.
        own = memoryview(bytearray(share_written(scratch / "async", WAITED, rank)))
        record(RAW_WRITTEN, timed(raw_write, scratch / f"raw_own{rank}", own))
        del own
        whole = timed(raw_write, scratch / "raw", all_bytes) if rank == 0 else timed(lambda: None)
        record("raw write + fsync, the whole state, rank 0", whole)
        record("memory copy of the state", timed(copy_all, copies, tensors))
        record("memory copy of one rank's share (state / ranks)", timed(copy_all, [share_copy], [share_source]))
        # The spread goes by whole tensors, so one rank may stage more than state / ranks: the floor of its blocking part.
        staged = torch.ones(largest_share(scratch / "async", 2 * ASYNC.every_steps), dtype=torch.uint8, device=DEVICE)
        staging = host_buffer(staged)
        record("memory copy of the largest rank's share", timed(copy_all, [staging], [staged]))
        del staged, staging
        cache(scratch / "noreplay")
        resumed, started = session_restore(scratch / "noreplay", megabytes, settle)
        record("legato resume, replay off (select, restore, verify)", resumed)
        record("legato Session start to first batch, resuming", started)
        cache(scratch / "A.pt")
        record("torch.load + load_state_dict, rank 0", timed(load_into, scratch / "A.pt" if rank == 0 else None, model, optimizer))
        cache(scratch / "A.pt")
        record("torch.load + load_state_dict, every rank", timed(load_into, scratch / "A.pt", model, optimizer))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    if rank == 0:
        out.update({name: statistics.median(values) for name, values in times.items()})
        out["bytes"] = total
        out["written"] = written
        out["peaks"] = {name: statistics.median(values) for name, values in peaks.items()}
    dist.destroy_process_group()


def prepare_parent() -> None:
    """The parent process of a benchmark whose ranks stop by SIGUSR2, before it spawns them."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the stop's signal is for the ranks
    # Every freed tensor goes back to the system at once (glibc otherwise raises its mmap threshold as large blocks are
    # freed, up to 32 MiB, and keeps the freed ones in per-thread arenas): each run's peak memory is then its own, not
    # lowered by what earlier runs left in the allocator. Tensors above 32 MiB (256 MiB states and up) are mapped anyway.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))


def on_ranks(target: Callable[..., None], world: int, parent: str, *args: object) -> dict:
    """Run `target(rank, world, port, *args, directory, out)` on `world` spawned ranks, in a scratch directory made under
    `parent` and removed after; what the ranks put in `out`."""
    directory = Path(tempfile.mkdtemp(prefix="legato-bench-", dir=parent))
    try:
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(target, nprocs=world, args=(world, free_port(), *args, str(directory), out))
            return dict(out)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mb", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="seconds to wait before each timed part (0: none)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state lives (cuda: every rank on GPU 0)")
    parser.add_argument(
        "--cold", action="store_true", help="start each restore row with the page cache dropped (root), not with its files cached"
    )
    args = parser.parse_args()
    if args.cold and not os.access(DROP_CACHES, os.W_OK):
        print(
            f"--cold drops the page cache before each restore row, which takes writing {DROP_CACHES}: only root may. Run "
            "the bench as root, or without --cold (each restore row then starts with its files cached).",
            file=sys.stderr,
        )
        sys.exit(2)
    bench_device.require(args.device)
    prepare_parent()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.rounds} rounds, medians, {args.settle:g} s settle before each; "
        f"ratios against torch.save + fsync (plain A); restores from {'disk (page cache dropped)' if args.cold else 'the page cache'}"
    )
    if args.device == "cuda":
        print(
            f"state on {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}), every rank on it, gloo; copies go to pinned host memory"
        )
    for world in args.ranks:
        for megabytes in args.mb:
            results = on_ranks(worker, world, args.dir, megabytes, args.rounds, args.settle, args.cold, args.device)
            anchor = results["control: torch.save + fsync, rank 0 (plain A)"]
            written, peaks, state = results.pop("written"), results.pop("peaks"), results.pop("bytes")
            print(f"\n{world} ranks, {state / 2**20:.0f} MiB state")
            print(f"| {'variant':<50} | seconds | ratio | MiB written |")
            print(f"| {'-' * 50} | ------- | ----- | ----------- |")
            for name, seconds in results.items():
                mib = f"{written[name] / 2**20:11.1f}" if name in written else " " * 11
                print(f"| {name:<50} | {seconds:7.3f} | {seconds / anchor:5.2f} | {mib} |")
            floor = results[RAW_WRITTEN]
            print(
                f"async background write / raw write + fsync of the bytes each rank wrote: {results[BACKGROUND] / floor:.2f}x "
                f"beside training, {results[BACKGROUND_ALONE] / floor:.2f}x alone (the slowest rank's hash, write, fsync and "
                "report of its share after the staging copy; the writer thread runs at nice 19)"
            )
            print_peaks(peaks, state, args.device)
    sys.stdout.flush()


def print_peaks(peaks: dict[str, float], state: int, device: str) -> None:
    """Peak memory of each run above the plain loop's (which never saves), the largest rank's, against the state."""
    if device == "cuda":
        print(
            "\npeak memory: not a reading with the state on the GPU. The kernel's high-water mark counts host memory only, "
            "and on an H200 most rows came out negative (docs/gpu.md, section 7): most likely torch's caching host allocator "
            "keeps pinned staging (gloo's collectives over CUDA tensors, the checkpoints' copies) from one run for the next, "
            "so a run's peak depends on the runs before it."
        )
        return
    plain = peaks.pop(PLAIN)
    print(
        f"\n{PLAIN}: peak {plain / 2**20:.1f} MiB above its start ({plain / state:.2f}x the state: its model, AdamW's "
        "moments, gradients, DDP's buckets and the optimizer's temporaries)"
    )
    print(f"| {'peak memory above the plain loop, largest rank':<50} |     MiB | / state |")
    print(f"| {'-' * 50} | ------- | ------- |")
    for name, value in peaks.items():
        print(f"| {name:<50} | {(value - plain) / 2**20:7.1f} | {(value - plain) / state:7.2f} |")


if __name__ == "__main__":
    main()
