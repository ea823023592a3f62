"""A user's own DDP loop made exactly resumable with legato's public API.

Launch one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set (srun, torchrun or by hand), e.g.:

    PYTHONHASHSEED=0 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/own_loop.py runs/own &
    PYTHONHASHSEED=0 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29512 python examples/own_loop.py runs/own

Send SIGUSR2 to any rank: all ranks stop after the same step, write one
barrier checkpoint and exit 75. Run the same commands again to resume,
verified bit for bit. `--signal-at STEP` makes rank 1 signal itself (demo).
"""

import argparse
import logging
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import legato


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--signal-at", type=int, action="append", default=[])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    legato.seed_everything(seed=42, rank=rank, mode="strict")

    data = torch.utils.data.TensorDataset(
        torch.randn(256, 8, generator=torch.Generator().manual_seed(0)), torch.randn(256, 1, generator=torch.Generator().manual_seed(1))
    )
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    loader = legato.resumable_loader(data, batch_size=16, seed=42, rank=rank, world_size=world)

    session = legato.Session(
        args.run_dir,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        total_steps=args.steps,
        # Steps of this toy take a millisecond: agree every step so the demo signal acts at once.
        checkpoint=legato.CheckpointPolicy(every_steps=10, agree_every_steps=1),
        chaos=legato.Chaos(signal_rank=1, signal_at_steps=tuple(args.signal_at)),
    )
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        session.report(loss)
        # A resume re-runs a few steps (its replay) through this loop: log only the steps that run for the first time.
        if rank == 0 and session.step % 10 == 0 and not session.replaying:
            logging.info("step %d loss %.4f (run %s, attempt %d)", session.step, loss.item(), session.run_id, session.attempt)

    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main())
