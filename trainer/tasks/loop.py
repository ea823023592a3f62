"""The bundled DDP training loop for the built-in tasks, written on the public API only."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.runtime.context import RunContext
from legato.tasks import build_task


def warmup_cosine(warmup: int, total: int):
    """The LambdaLR factor of a step: a linear warmup over `warmup` steps, then a cosine decay to 0 at `total`."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def train(ctx: RunContext) -> int:
    """The built-in training loop for the config's task, under a Session; the Session's exit code."""
    cfg = ctx.cfg.train
    task = build_task(cfg.task, ctx.options, ctx.cfg.determinism.seed)
    model = task.model.to(ctx.device)
    net = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None) if dist.is_initialized() else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_steps, cfg.steps))
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.amp) if cfg.amp else None
    session = ctx.session(model=net, optimizer=optimizer, loader=ctx.loader(task.dataset), scheduler=scheduler, scaler=scaler)
    for batch in session:
        batch = [t.to(ctx.device, non_blocking=True) for t in batch]
        with torch.autocast(ctx.device.type, dtype=ctx.amp_dtype, enabled=cfg.amp):
            loss = task.loss(net, batch)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        scheduler.step()
        session.report(loss)
    return session.exit_code
