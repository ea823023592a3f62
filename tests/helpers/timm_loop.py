"""One rank of a loop in the style of timm's train.py (launch one process per rank, gloo).

    python tests/helpers/timm_loop.py RUN_DIR --style plain|naive|ported [--replay-steps K]

Like timm's train.py: a `train_one_epoch` that builds its own `AverageMeter`, updates the scheduler every step with
`step_update(num_updates, metric=losses_m.avg)` (timm's scheduler keeps that metric in its state: each rank's own
loss average), mixup whose mixing weight comes from numpy's global RNG, an EMA of the weights, validation after
each epoch through the DDP wrapper, `scheduler.step(epoch + 1, metric)`, and a best-checkpoint saver keeping a list
of (metric, file) and the best epoch as plain attributes. The data comes from torch's DataLoader with a
DistributedSampler whose epoch the loop sets.

- `plain`: the loop without legato (each rank writes its per-step loss bits and final digests);
- `naive`: ported as a new user would at first, everything passed that has a state_dict; the meter and the saver are
  plain objects legato does not save (the census must name them);
- `ported`: the meter made once outside the epoch function (reset at an epoch's first step) and both it and the
  saver registered with `legato.attributes`.

Stops come from the environment (LEGATO_CHAOS_SIGNAL_AT, a real SIGUSR2). A finished run writes RUN_DIR/result_rank<R>.json:
the losses as float.hex, and digests of the model, the EMA, the scheduler's state and the saver's list.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import legato

EPOCHS, BATCH, CLASSES = 3, 8, 4


class AverageMeter:
    """timm.utils.AverageMeter."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class CosineScheduler:
    """timm's Scheduler: per-update cosine, its state every attribute but the optimizer (the last metric included)."""

    def __init__(self, optimizer: torch.optim.Optimizer, t_updates: int) -> None:
        self.optimizer, self.t_updates = optimizer, t_updates
        self.base_lr = optimizer.param_groups[0]["lr"]
        self.metric: float | None = None

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)

    def step(self, epoch: int, metric: float | None = None) -> None:
        self.metric = metric

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        self.metric = metric
        lr = 0.5 * self.base_lr * (1 + math.cos(math.pi * min(num_updates, self.t_updates) / self.t_updates))
        for group in self.optimizer.param_groups:
            group["lr"] = lr


class CheckpointSaver:
    """timm's CheckpointSaver in brief: the best checkpoints as (metric, file), best first, and the best epoch."""

    def __init__(self, max_history: int = 2) -> None:
        self.checkpoint_files: list[tuple[float, str]] = []
        self.best_epoch: int | None = None
        self.best_metric: float | None = None
        self.max_history = max_history

    def save_checkpoint(self, epoch: int, metric: float) -> tuple[float | None, int | None]:
        self.checkpoint_files = sorted([*self.checkpoint_files, (metric, f"checkpoint-{epoch}.pth.tar")], reverse=True)
        self.checkpoint_files = self.checkpoint_files[: self.max_history]
        if self.best_metric is None or metric > self.best_metric:
            self.best_epoch, self.best_metric = epoch, metric
        return self.best_metric, self.best_epoch


def build(rank: int) -> tuple[torch.nn.Module, DDP, torch.optim.Optimizer, AveragedModel, DataLoader, DistributedSampler]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, CLASSES))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(96, 6, generator=gen)
    dataset = TensorDataset(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    return model, DDP(model), optimizer, ema, loader, sampler


def mixup(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's Mixup in brief: the weight from numpy's global RNG, the pairing from torch's."""
    lam = float(np.random.beta(1.0, 1.0))
    index = torch.randperm(x.size(0))
    target = F.one_hot(y, CLASSES).float()
    return lam * x + (1 - lam) * x[index], lam * target + (1 - lam) * target[index]


def train_one_epoch(
    epoch: int,
    batches: Iterable,
    net: DDP,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: CosineScheduler,
    ema: AveragedModel,
    steps_per_epoch: int,
    report,
    losses_m: AverageMeter | None = None,
    first: int = 0,
) -> dict:
    if losses_m is None:
        losses_m = AverageMeter()  # timm's own: a new meter every epoch
    elif first == 0:
        losses_m.reset()  # the ported meter lives outside; an epoch resumed in its middle keeps what it had
    num_updates = epoch * steps_per_epoch + first
    for x, y in batches:
        x, soft = mixup(x, y)
        loss = torch.sum(-soft * F.log_softmax(net(x), dim=-1), dim=-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update_parameters(model)
        losses_m.update(loss.item(), x.size(0))
        num_updates += 1
        scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)
        report(loss)
    return {"loss": losses_m.avg}


def validate(net: DDP, rank: int) -> float:
    net.eval()
    with torch.no_grad():
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(50 + rank))
        correct = (net(x).argmax(1) == ((x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long())).float().mean()
    net.train()
    dist.all_reduce(correct)
    return float(correct) / dist.get_world_size()


def digest(value: object) -> str:
    h = hashlib.sha256()
    if isinstance(value, torch.nn.Module):
        for name, tensor in value.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(repr(value).encode())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--style", choices=("plain", "naive", "ported"), required=True)
    parser.add_argument("--replay-steps", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    np.random.seed(10 + rank)  # timm seeds every RNG per rank
    model, net, optimizer, ema, loader, sampler = build(rank)
    steps_per_epoch = len(loader)
    scheduler, saver = CosineScheduler(optimizer, EPOCHS * steps_per_epoch), CheckpointSaver()
    losses_m = AverageMeter() if args.style == "ported" else None
    losses: list[str] = []
    try:
        if args.style == "plain":
            for epoch in range(EPOCHS):
                sampler.set_epoch(epoch)
                train_one_epoch(
                    epoch, loader, net, model, optimizer, scheduler, ema, steps_per_epoch, lambda loss: losses.append(loss.item().hex())
                )
                saver.save_checkpoint(epoch, validate(net, rank))
                scheduler.step(epoch + 1, saver.best_metric)
        else:
            extras: dict = {"ema": ema}
            if args.style == "ported":
                extras.update(
                    losses=legato.attributes(losses_m), saver=legato.attributes(saver, "checkpoint_files", "best_epoch", "best_metric")
                )
            session = legato.Session(
                args.run_dir,
                model=net,
                optimizer=optimizer,
                loader=loader,
                total_epochs=EPOCHS,
                scheduler=scheduler,
                extras=extras,
                checkpoint=legato.CheckpointPolicy(replay_steps=args.replay_steps, replay_cost=0, agree_every_steps=1),
            )
            for epoch in session.epochs():
                sampler.set_epoch(epoch)
                train_one_epoch(
                    epoch,
                    session.batches(),
                    net,
                    model,
                    optimizer,
                    scheduler,
                    ema,
                    steps_per_epoch,
                    session.report,
                    losses_m,
                    session.step_in_epoch,
                )
                if session.stopped:
                    break
                saver.save_checkpoint(epoch, validate(net, rank))
                scheduler.step(epoch + 1, saver.best_metric)
            if session.exit_code != 0:
                return session.exit_code
            losses = [json.loads(line)["loss_hex"] for line in (args.run_dir / "trajectory" / f"rank{rank}.jsonl").read_text().splitlines()]
        args.run_dir.mkdir(parents=True, exist_ok=True)
        result = {
            "loss_hex": losses,
            "model": digest(model),
            "ema": digest(ema),
            "scheduler": digest(scheduler.state_dict()),
            "saver": [saver.checkpoint_files, saver.best_epoch, saver.best_metric],
        }
        (args.run_dir / f"result_rank{rank}.json").write_text(json.dumps(result))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
