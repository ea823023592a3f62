"""A DDP-tutorial-style user script with TensorBoard on rank 0, per-epoch validation and a per-epoch LR schedule.

What a new user writes: their own DataLoader over a DistributedSampler (set_epoch each epoch), AdamW, a
cosine schedule stepped per epoch, validation after each epoch's batches, a SummaryWriter on rank 0, and
legato's patterns for dashboards and the epoch body (docs/your-loop.md):

- the writer is created once the loop began, with `purge_step=session.resumed_step`: points a killed attempt
  logged past the checkpoint this attempt resumed are dropped by TensorBoard;
- nothing is logged while `session.replaying` (the resume re-runs steps already logged), everything else runs;
- `if session.stopped: break` after the batches: validation and the scheduler wait for the resumed run.

The ranks agree every 2 steps: the test slows steps from outside (LEGATO_CHAOS_STEP_SLEEP_S) but not the replayed
ones, and an interval learned from fast replayed steps would let the slowed steps run past a stop for many seconds.

Run as `python -m legato.torchrun --nproc-per-node 2 tracker_loop.py RUN_DIR`. TRACKER_FAULT plants one
fault a checker must catch: "log-replay" (logs replayed steps too), "no-purge" (no purge_step),
"validate-after-stop" (validation and the scheduler run after a stop). Rank 0 prints its run id, attempt
and resumed step (what a tracker continues under) to stderr.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

import legato

EPOCHS, BATCH, SAMPLES = 4, 8, 384  # 384 / 2 ranks / 8 = 24 steps per epoch
FAULT = os.environ.get("TRACKER_FAULT", "")


def validate(model, loader):
    model.eval()
    with torch.no_grad():
        total = sum(F.mse_loss(model(x), y, reduction="sum") for x, y in loader)
    model.train()
    return float(total) / len(loader.dataset)


def main(run_dir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES + 64, 16, generator=gen)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(SAMPLES + 64, 1, generator=gen)
    train = TensorDataset(x[:SAMPLES], y[:SAMPLES])
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler, drop_last=True)
    val_loader = DataLoader(TensorDataset(x[SAMPLES:], y[SAMPLES:]), batch_size=32)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=optimizer,
        loader=loader,
        total_epochs=EPOCHS,
        scheduler=scheduler,
        checkpoint=legato.CheckpointPolicy(every_steps=20, agree_every_steps=2),
    )
    writer = None
    for epoch in session.epochs():
        sampler.set_epoch(epoch)
        if rank == 0 and writer is None:
            purge = None if FAULT == "no-purge" else session.resumed_step
            writer = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=purge, flush_secs=1)
            print(f"tracker: run {session.run_id} attempt {session.attempt} resumed at step {session.resumed_step}", file=sys.stderr)
        for xb, yb in session.batches():
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(loss)
            if writer is not None and (not session.replaying or FAULT == "log-replay"):
                writer.add_scalar("train/loss", loss.item(), session.step)
        if session.stopped and FAULT != "validate-after-stop":
            break
        val_loss = validate(model, val_loader)
        scheduler.step()
        if writer is not None and not session.replaying:
            writer.add_scalar("val/loss", val_loss, session.step)
    if writer is not None:
        writer.close()
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
