"""The bundled training loop for the built-in tasks, under DDP or FSDP2, written on the public API only.

It is an entrypoint like a user's: the launchers name it (legato.runtime.entrypoint.BUNDLED_LOOP) rather than import it,
as it stands on the rank entry's RunContext. It must never be imported by the core.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.runtime.context import RunContext
from legato.tasks import build_task
from legato.tasks.sharding import fully_shard_model


def warmup_cosine(warmup: int, total: int):
    """The LambdaLR factor of a step: a linear warmup over `warmup` steps, then a cosine decay to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def wrap(model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
    """The model as the ranks train it: DDP (replicated), FSDP2 (sharded, in place), or as it is without a process group."""
    if not dist.is_initialized():
        return model
    if ctx.cfg.train.parallel == "fsdp2":
        return fully_shard_model(model, ctx.device, ctx.cfg.train.fsdp2)
    return DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def micro_step(net: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Gradients are reduced after the last micro-batch of a step only: DDP's no_sync(), FSDP2's gradient sync switch."""
    if isinstance(net, DDP):
        return contextlib.nullcontext() if last else net.no_sync()
    if hasattr(net, "set_requires_gradient_sync"):
        # FSDP2's method (fully_shard swaps the module's class); Module.__getattr__ is typed as a tensor or module.
        net.set_requires_gradient_sync(last)  # type: ignore[operator]
    return contextlib.nullcontext()


def train(ctx: RunContext) -> int:
    """The built-in training loop for the config's task, under a Session; the Session's exit code."""
    cfg = ctx.cfg.train
    assert cfg.task is not None  # the bundled loop runs a config without an entrypoint, which names its task
    task = build_task(cfg.task, ctx.options, ctx.cfg.determinism.seed)
    model = task.model.to(ctx.device)
    net = wrap(model, ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_steps, cfg.steps))
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.amp) if cfg.amp else None
    session = ctx.session(model=net, optimizer=optimizer, loader=ctx.loader(task.dataset), scheduler=scheduler, scaler=scaler)
    for batch in session:
        batch = [t.to(ctx.device, non_blocking=True) for t in batch]
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ctx.device)
        for i, micro in enumerate(zip(*(t.chunk(cfg.accumulate) for t in batch))):
            with micro_step(net, last=i == cfg.accumulate - 1):
                with torch.autocast(ctx.device.type, dtype=ctx.amp_dtype, enabled=cfg.amp):
                    loss = task.loss(net, list(micro)) / cfg.accumulate
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        session.report(total if cfg.accumulate > 1 else loss)
    return session.exit_code
