"""One rank of a ResNet-style DDP loop whose trajectory depends on DDP's own process state (launch one process per rank, gloo).

    python tests/helpers/framework_state.py RUN_DIR --accumulate N [--validate] [--steps S] [--plain] [--skip-restore NAME]

A small CNN with BatchNorm under `DistributedDataParallel` (broadcast_buffers=True, the default), an EMA of
weights and buffers (`AveragedModel(..., use_buffers=True)`, registered as an extra), SGD with momentum, and
gradient accumulation over N micro-batches with `no_sync()`, one Session step per micro-batch. With
`--validate` a no-grad pass through the DDP wrapper runs before the loop, as a baseline evaluation does.

Whether DDP broadcasts rank 0's BatchNorm buffers before a forward is decided by a flag of the wrapper
(`require_forward_param_sync`) that the previous forward left: cleared by a forward under `no_sync()` or
`no_grad`, set by a synced one. A fresh process has it set, so a resume whose step follows a `no_sync`
micro-step (or a validation pass) broadcasts where the uninterrupted run did not, unless legato restores it.
Each rank's two data shards differ, so a broadcast changes the bits.

Stops are planted from the environment (LEGATO_CHAOS_SIGNAL_AT, a real SIGUSR2); `--skip-restore NAME` leaves a
component unrestored (a planted fault). A finished Session run writes each rank's final digests to
RUN_DIR/final_rank<R>.json; `--plain` runs the same loop without legato and writes each rank's per-step loss bits and
final digests to RUN_DIR/rank<R>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import legato

BATCH = 4


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, AveragedModel]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    return model, optimizer, ema


def data(rank: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(steps * BATCH, 3, 8, 8, generator=gen), torch.randint(0, 4, (steps * BATCH,), generator=gen)


def micro_step(
    net: DDP,
    optimizer: torch.optim.Optimizer,
    ema: AveragedModel,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    step: int,
    accumulate: int,
) -> torch.Tensor:
    """One micro-batch; the last of each accumulation reduces the gradients, steps and updates the EMA."""
    sync = (step + 1) % accumulate == 0
    with contextlib.nullcontext() if sync else net.no_sync():
        loss = F.cross_entropy(net(x), y)
        (loss / accumulate).backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema.update_parameters(model)
    return loss


def validate(net: DDP, rank: int) -> None:
    """A baseline evaluation through the wrapper: eval mode, no grad (it clears DDP's forward-sync flag)."""
    net.eval()
    with torch.no_grad():
        net(torch.randn(BATCH, 3, 8, 8, generator=torch.Generator().manual_seed(7 + rank)))
    net.train()


def digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--accumulate", type=int, required=True)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--plain", action="store_true", help="run without legato, writing RUN_DIR/rank<R>.json")
    parser.add_argument("--skip-restore", default="", help="a component left unrestored (chaos)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer, ema = build()
    net = DDP(model)
    xs, ys = data(rank, args.steps)
    if args.validate:
        validate(net, rank)
    try:
        if args.plain:
            losses = [
                micro_step(net, optimizer, ema, model, xs[s * BATCH : (s + 1) * BATCH], ys[s * BATCH : (s + 1) * BATCH], s, args.accumulate)
                .item()
                .hex()
                for s in range(args.steps)
            ]
            args.run_dir.mkdir(parents=True, exist_ok=True)
            result = {"loss_hex": losses, "model": digest(model), "ema": digest(ema)}
            (args.run_dir / f"rank{rank}.json").write_text(json.dumps(result))
            return 0
        session = legato.Session(
            args.run_dir,
            model=net,
            optimizer=optimizer,
            total_steps=args.steps,
            extras={"ema": ema},
            checkpoint=legato.CheckpointPolicy(replay_steps=3, replay_cost=0, hash_every_steps=1, agree_every_steps=1),
            chaos=dataclasses.replace(legato.Chaos.from_env(), skip_restore=frozenset({args.skip_restore})),
        )
        for step in session:
            x, y = xs[step * BATCH : (step + 1) * BATCH], ys[step * BATCH : (step + 1) * BATCH]
            session.report(micro_step(net, optimizer, ema, model, x, y, step, args.accumulate))
        if session.exit_code == 0:
            (args.run_dir / f"final_rank{rank}.json").write_text(json.dumps({"model": digest(model), "ema": digest(ema)}))
        return session.exit_code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
