"""A DDP-tutorial-style user script with TensorBoard on rank 0, per-epoch validation and a per-epoch LR schedule.

What a new user writes: their own DataLoader over a DistributedSampler (set_epoch each epoch), AdamW, a
cosine schedule stepped per epoch, validation after each epoch's batches, a SummaryWriter on rank 0, and
legato's patterns for dashboards and the epoch body (docs/your-loop.md):

- `session.tracker(tensorboard=..., wandb=...)` and `tracker.log({...})`: rank 0 only, nothing while the resume
  re-runs steps already logged, TensorBoard purging from the resumed step what a killed attempt logged past it;
- `if session.stopped: break` after the batches: validation and the scheduler wait for the resumed run.

The planted faults use the pattern the tracker replaces, by hand, with one piece wrong: a SummaryWriter created
once the loop began with `purge_step=session.resumed_step`, logging under `not session.replaying`.
With TRACKER_WANDB=1 the tracker also logs to W&B offline, under RUN_DIR/wandb (W&B's own default schedule).

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
    tracker = by_hand = None
    if FAULT:
        by_hand = ByHand(session, rank, os.path.join(run_dir, "tb"))
    else:
        wandb = {"project": "legato-test", "mode": "offline", "dir": run_dir} if os.environ.get("TRACKER_WANDB") else None
        tracker = session.tracker(tensorboard=os.path.join(run_dir, "tb"), tensorboard_options={"flush_secs": 1}, wandb=wandb)
    log = tracker.log if tracker is not None else by_hand.log
    said = False
    for epoch in session.epochs():
        sampler.set_epoch(epoch)
        if rank == 0 and not said:
            said = True
            print(f"tracker: run {session.run_id} attempt {session.attempt} resumed at step {session.resumed_step}", file=sys.stderr)
        for xb, yb in session.batches():
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.report(loss)
            log({"train/loss": loss.item()})
        if session.stopped and FAULT != "validate-after-stop":
            break
        val_loss = validate(model, val_loader)
        scheduler.step()
        log({"val/loss": val_loss})
    (tracker or by_hand).close()
    dist.destroy_process_group()
    return session.exit_code


class ByHand:
    """The pattern the tracker replaces, written out, with the planted fault (TRACKER_FAULT) in it."""

    def __init__(self, session, rank, log_dir):
        self.session, self.rank, self.log_dir, self.writer, self.wandb = session, rank, log_dir, None, None

    def log(self, values):
        if self.rank != 0 or (self.session.replaying and FAULT != "log-replay"):
            return
        if self.writer is None:
            purge = None if FAULT == "no-purge" else self.session.resumed_step
            self.writer = SummaryWriter(self.log_dir, purge_step=purge, flush_secs=1)
            if os.environ.get("TRACKER_WANDB"):
                import wandb

                run_dir = os.path.dirname(self.log_dir)
                self.wandb = wandb.init(id=self.session.run_id, resume="allow", project="legato-test", mode="offline", dir=run_dir)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, self.session.step)
        if self.wandb is not None:
            self.wandb.log(dict(values), step=self.session.step)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
