"""One rank of an FSDP2 loop that may resume on another world size (launch one process per rank, gloo).

    python tests/helpers/fsdp2_reshard.py OUT_DIR

A small MLP whose dimensions 2 and 4 ranks do not all divide (FSDP2 pads the last shards), `fully_shard`ed per
layer and at the root, AdamW, legato's resumable loader over 96 indexed samples with a global batch of 16
(per-rank batch 16 / world size, so the global batch stays the same whatever the world size; GLOBAL_BATCH changes
it), 36 steps.
RESHARD=1 opts into resuming a checkpoint of another world size (CheckpointPolicy(reshard=True)); REPLAY_STEPS sets
replay_steps (default 32: the base of a stop in the first epoch is step 0).

Each rank appends the sample indices of every step to OUT_DIR/samples_rank<R>_ws<W>.jsonl; at the first step of
the first resumed process at a world size (before it trains), rank 0 writes the full (gathered) model and optimizer state to
OUT_DIR/resume_point_ws<W>.pt. A refusal (UsageError) is, as in any script, one paragraph on stderr and exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset

import legato
from legato.state.sharded import is_dtensor

GLOBAL_BATCH, SAMPLES, STEPS = 16, 96, 36


def full(value):
    """`value` with every DTensor gathered into its full tensor (a collective: every rank calls it in the same order)."""
    if is_dtensor(value):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, list):
        return [full(v) for v in value]
    return value


def main(out: Path) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randn(SAMPLES, 6, generator=torch.Generator().manual_seed(1))
    dataset = TensorDataset(torch.arange(SAMPLES), data, data[:, :3].sin())
    global_batch = int(os.environ.get("GLOBAL_BATCH", GLOBAL_BATCH))  # a test changes it to plant a fault
    loader = legato.resumable_loader(dataset, global_batch // world, seed=7, rank=rank, world_size=world)
    policy = legato.CheckpointPolicy(
        every_minutes=0,
        reshard=os.environ.get("RESHARD") == "1",
        replay_steps=int(os.environ.get("REPLAY_STEPS", "32")),
        replay_cost=0,
    )
    session = legato.Session(out, model=model, optimizer=optimizer, loader=loader, total_steps=STEPS, checkpoint=policy)
    first = True
    with (out / f"samples_rank{rank}_ws{world}.jsonl").open("a") as log:
        for index, x, y in session:
            step = session.step
            if first and session.resumed is not None:
                state = {"model": full(model.state_dict()), "optimizer": full(optimizer.state_dict())}
                if rank == 0 and not (out / f"resume_point_ws{world}.pt").exists():
                    torch.save(state, out / f"resume_point_ws{world}.pt")
            first = False
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            session.report(loss)
            if step >= session.resumed_step:  # a replay re-runs the steps before it: they were logged by the attempt that ran them
                log.write(json.dumps({"step": step, "samples": index.tolist()}) + "\n")
                log.flush()
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
