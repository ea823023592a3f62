"""One rank of a DDP loop for the stop checkpoint that writes its state once (launch one process per rank, gloo).

    python tests/helpers/stop_once.py OUT_DIR

A model of about 4 MiB of state (two linear layers, SGD with momentum), legato's resumable loader, 24 steps,
a replay base every 4 steps, the trajectory hashed every step. Settings by environment:

- VERIFY: checkpoint.verify ("error", the default, or "warn");
- REPLAY_STEPS: replay_steps (default 4); EVERY_STEPS: periodic checkpoints (default 0: none); KEEP_LAST (default 3);
- FAULT=1: planted fault, the step made non-deterministic (noise from an unseeded generator) on every step of
  this process, so a replay of the steps before a stop checkpoint diverges;
- ASYNC=1: periodic checkpoints written in the background (CheckpointPolicy(async_=True));
- DIVERGE=1: planted fault, each rank scales its own (already averaged) gradients by 1 + rank / 8 before the step,
  so the ranks' "replicated" parameters differ from the first step on;
- WRITER_BUG=R:N: planted fault, rank R's background writer raises KeyError("planted") as it writes checkpoint N (a
  bug in the writer, not the disk);
- READ_ERROR=first|verifying: planted fault, rank 0's reads of checkpoint manifests fail with OSError(EIO), as a
  failing disk's do, while it picks the checkpoint to resume and its peers wait for the pick: in the first pick
  (sizes only, rank 0 alone), or in the pick that verifies each candidate while the other ranks serve it (after the
  newest checkpoint's files failed to verify).

A refusal (UsageError) is, as in any script, one paragraph on stderr and exit 2; a failed resume verification exits 3.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import legato

STEPS, SAMPLES, WIDTH = 24, 192, 512


def plant_writer_bug(rank: int, spec: str) -> None:
    """WRITER_BUG: wrap the background writer so that rank R's write of checkpoint N raises a bug's error."""
    from legato.store.async_checkpoint import AsyncCheckpointer

    bug_rank, step = (int(part) for part in spec.split(":"))
    write = AsyncCheckpointer._write

    def planted(self: AsyncCheckpointer, job: Any, tmp: Path) -> None:
        if rank == bug_rank and job.step == step:
            raise KeyError("planted")
        write(self, job, tmp)

    AsyncCheckpointer._write = planted  # type: ignore[method-assign]


def plant_read_error(pick: str) -> None:
    """READ_ERROR: this process's reads of a checkpoint's manifest fail as a failing disk's do, in the `pick` named."""
    import errno

    from legato.store import resumable
    from legato.store.manifest import check_listed

    read = resumable.read_manifest

    def failing(path: Path, verify: Any = None) -> dict:
        if (verify is check_listed) == (pick == "first"):
            raise OSError(errno.EIO, "Input/output error (planted)")
        return read(path, verify)

    resumable.read_manifest = failing


def main(out: Path) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if "WRITER_BUG" in os.environ:
        plant_writer_bug(rank, os.environ["WRITER_BUG"])
    if "READ_ERROR" in os.environ and rank == 0:
        plant_read_error(os.environ["READ_ERROR"])
    legato.seed_everything(3, rank=rank, mode="fast")
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH))
    net = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(SAMPLES, WIDTH, generator=torch.Generator().manual_seed(1))
    loader = legato.resumable_loader(torch.utils.data.TensorDataset(data, data.tanh()), 4, seed=7, rank=rank, world_size=world)
    env = os.environ
    policy = legato.CheckpointPolicy(
        every_minutes=0,
        every_steps=int(env.get("EVERY_STEPS", "0")),
        keep_last=int(env.get("KEEP_LAST", "3")),
        verify=env.get("VERIFY", "error"),
        replay_steps=int(env.get("REPLAY_STEPS", "4")),
        replay_cost=0,
        hash_every_steps=1,
        agree_every_steps=1,
        async_=True if env.get("ASYNC") == "1" else None,
    )
    scale = 1 + rank / 8 if env.get("DIVERGE") == "1" else None
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little")) if env.get("FAULT") == "1" else None
    session = legato.Session(out, model=net, optimizer=optimizer, loader=loader, total_steps=STEPS, checkpoint=policy)
    for x, y in session:
        if noise is not None:
            x = x + 1e-3 * torch.randn(x.shape, generator=noise)
        loss = F.mse_loss(net(x), y)
        loss.backward()
        if scale is not None:
            for p in model.parameters():
                p.grad.mul_(scale)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        session.report(loss)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    try:
        sys.exit(main(Path(sys.argv[1])))
    except legato.ResumeMismatchError as exc:
        logging.error("%s", exc)
        sys.exit(exc.exit_code)
