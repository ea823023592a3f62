"""Benchmark of checkpointing FSDP2 state: legato's sharded barrier checkpoint against DCP's save and async_save.

Two ranks (gloo) hold a `fully_shard`ed model and its AdamW state, --mb MiB in
all. Each round writes that same state once in every way, side by side, so
the drift of a shared machine touches all of them alike: legato's barrier
checkpoint (each rank's shard records, one hash pass, the commit protocol's
stage / write / agree / publish), DCP `save` of the state dicts DCP's own
helpers return (`get_model_state_dict` / `get_optimizer_state_dict`), and DCP
`async_save` of the same (the part the loop waits for, and the total until
its future resolves). Every way includes taking the state dict; directories
are removed between rounds, outside the timing. Medians over --rounds.

    python benchmarks/bench_fsdp2_checkpoint.py [--mb 256] [--rounds 5] [--dir /tmp]
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
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from legato.runtime.launch import free_port
from legato.state import components as table
from legato.state.components import Component
from legato.state.file_names import SHARD_FILE
from legato.state.hashing import Digests, rank_hash
from legato.state.sharded import Shards, meshes_of
from legato.store import checkpoint as ckpt
from legato.store import layout

WAYS = ("legato sharded checkpoint", "DCP save", "DCP async_save, blocking", "DCP async_save, total")
WORLD = 2


def _timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    hidden = int((args.mb * 2**20 / 4 / 3) ** 0.5)  # parameters + two AdamW moments = 3 copies
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden, bias=False))
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, hidden)).sum().backward()
    optimizer.step()
    meshes = meshes_of(model)
    rows = [Component("model", Shards(model, meshes), SHARD_FILE), Component("optimizer", Shards(optimizer, meshes), SHARD_FILE)]
    root = Path(args.dir) / "bench_fsdp2"

    def legato_save(step: int) -> None:
        parts = table.capture(rows)
        seen = Digests()
        digests = table.digests(parts, seen)
        share = ckpt.RankShare(rank, layout.files(rows, parts, rank), digests, rank_hash(digests), seen=(seen,))
        ckpt.write_checkpoint(root / "legato", step, share, WORLD, dist.group.WORLD, {}, keep_last=1)

    def state() -> dict:
        return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}

    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for step in range(args.rounds):
        times["legato sharded checkpoint"].append(_timed(lambda step=step: legato_save(step)))
        times["DCP save"].append(_timed(lambda step=step: dcp.save(state(), checkpoint_id=root / f"dcp_{step}")))
        dist.barrier()
        start = time.perf_counter()
        future = dcp.async_save(state(), checkpoint_id=root / f"dcp_async_{step}")
        times["DCP async_save, blocking"].append(time.perf_counter() - start)
        future.result()
        dist.barrier()
        times["DCP async_save, total"].append(time.perf_counter() - start)
        if rank == 0:
            for old in root.glob("dcp*"):
                shutil.rmtree(old)
        dist.barrier()
    if rank == 0:
        out["bytes"] = sum(p.to_local().nbytes * 3 for p in model.parameters()) * WORLD
        out.update({way: statistics.median(values) for way, values in times.items()})
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="model + AdamW state in MiB, over both ranks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {WORLD} ranks gloo, 1 thread each, checkpoint dir {args.dir}")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), args, out), nprocs=WORLD, join=True)
        result = dict(out)
    size = result["bytes"] / 2**20
    print(f"FSDP2 state of {size:.0f} MiB (model + AdamW, sharded over {WORLD} ranks), median of {args.rounds} rounds")
    base = result["DCP save"]
    for way in WAYS:
        print(f"   {way:<28} {result[way]:7.3f} s  {size / result[way]:8.1f} MiB/s   {result[way] / base:5.2f}x DCP save")


if __name__ == "__main__":
    main(sys.argv[1:])
