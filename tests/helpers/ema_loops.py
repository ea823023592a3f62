"""One rank of a DDP loop that keeps an EMA of its model (launch one process per rank, gloo).

    python tests/helpers/ema_loops.py RUN_DIR --ema averaged|manual|registered|ignored [--census warn|strict]

- `averaged`: a `torch.optim.swa_utils.AveragedModel` with an EMA average, left unregistered;
- `manual`: a `copy.deepcopy` of the model updated with `lerp_`, left unregistered (the held-out case);
- `registered`: the AveragedModel passed to `extras` (it is saved, and the census must say nothing);
- `ignored`: the manual copy passed to `ignore=` (the census must say nothing).

`entry(ctx)` is the `averaged` loop as a `train.entrypoint` (its Session from the config).
Each rank writes the digest of its final EMA weights to RUN_DIR/ema_rank<R>.txt.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import legato

DECAY = 0.9


def build(rank: int, kind: str) -> tuple[torch.nn.Module, DDP, torch.optim.Optimizer, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    net = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if kind in ("averaged", "registered"):
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY))
    else:
        ema = copy.deepcopy(model).requires_grad_(False)
    return model, net, optimizer, ema, torch.randn(400, 6, generator=torch.Generator().manual_seed(rank))


def train(
    session: legato.Session, model: torch.nn.Module, net: DDP, optimizer: torch.optim.Optimizer, ema: torch.nn.Module, data: torch.Tensor
) -> None:
    for step in session:
        x = data[step * 8 : (step + 1) * 8]
        loss = F.mse_loss(net(x), x.sum(1, keepdim=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if isinstance(ema, AveragedModel):
            ema.update_parameters(model)
        else:
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.lerp_(p, 1 - DECAY)
        session.report(loss)


def entry(ctx: legato.RunContext) -> int:
    """The `averaged` loop as a `train.entrypoint`: the Session comes from the config (determinism.mode decides strictness)."""
    model, net, optimizer, ema, data = build(ctx.rank, "averaged")
    session = ctx.session(model=net, optimizer=optimizer, total_steps=12)
    train(session, model, net, optimizer, ema, data)
    return session.exit_code


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ema", choices=("averaged", "manual", "registered", "ignored"), required=True)
    parser.add_argument("--census", choices=("warn", "strict"), default="warn")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, net, optimizer, ema, data = build(rank, args.ema)
    # A replay base 2 steps back: a replay from step 0 would rebuild the EMA from scratch and hide the fault.
    session = legato.Session(
        args.run_dir,
        model=net,
        optimizer=optimizer,
        total_steps=12,
        census=args.census,
        checkpoint=legato.CheckpointPolicy(replay_steps=2, replay_cost=0),
        extras={"ema": ema} if args.ema == "registered" else None,
        ignore=[ema] if args.ema == "ignored" else (),
    )
    train(session, model, net, optimizer, ema, data)
    weights = ema.module if isinstance(ema, AveragedModel) else ema
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in weights.parameters())).hexdigest()
    (args.run_dir / f"ema_rank{rank}.txt").write_text(digest)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main())
