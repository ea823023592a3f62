"""One rank of the same DDP loop, plain or under a legato Session (launch one process per rank, gloo).

    python tests/helpers/plain_vs_legato.py OUT_DIR [--compile inner|outer] [--legato [--replay-steps K] [--skip-buckets]]

A model with several gradient buckets (bucket_cap_mb small, so DDP's rebuilt
layout has several buckets and a first layer used twice, so the gradient-ready
order is not the parameters' order), trained for STEPS steps. Rank 0 appends
the digest of the parameters after every step it runs to OUT_DIR/digests.txt
("step digest" lines), so a plain run, an uninterrupted legato run and a legato
run resumed across stops can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 8


class Net(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(12, width)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h) + self.embed(x).mean(1, keepdim=True)  # embed used again last: its gradient is ready last


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--legato", action="store_true")
    parser.add_argument("--replay-steps", type=int, default=0)
    parser.add_argument("--skip-buckets", action="store_true", help="plant the fault: leave DDP's own layout on resume")
    parser.add_argument("--compile", choices=["inner", "outer"], help="torch.compile the model inside DDP (nanoGPT) or the DDP model")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # Eager: about 10 KB a bucket, 5 to 6 buckets once rebuilt. Compiled: dynamo's DDP graph splitting needs buckets of at
    # least 1 MiB (DDP's first bucket), so the model is wider for the same count.
    width, bucket_cap_mb = (512, 1.0) if args.compile else (48, 0.01)
    model = Net(width)
    net = DDP(torch.compile(model) if args.compile == "inner" else model, bucket_cap_mb=bucket_cap_mb)
    if args.compile == "outer":
        net = torch.compile(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.randn(STEPS, 16, 12, generator=torch.Generator().manual_seed(100 + rank))
    args.out.mkdir(parents=True, exist_ok=True)
    session = None
    if args.legato:
        import legato

        chaos = legato.Chaos.from_env()
        if args.skip_buckets:
            chaos = dataclasses.replace(chaos, skip_restore=frozenset({"buckets"}))
        session = legato.Session(
            args.out,
            model=net,
            optimizer=optimizer,
            total_steps=STEPS,
            census="strict",
            chaos=chaos,
            checkpoint=legato.CheckpointPolicy(hash_every_steps=1, agree_every_steps=1, replay_steps=args.replay_steps, replay_cost=0),
        )
    for step in session if session is not None else range(STEPS):
        x = data[step]
        loss = F.mse_loss(net(x), x.sum(1, keepdim=True).sin())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if session is not None:
            session.report(loss)
        if rank == 0:
            digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
            with open(args.out / "digests.txt", "a") as f:
                f.write(f"{step} {digest}\n")
    dist.destroy_process_group()
    return 0 if session is None else session.exit_code


if __name__ == "__main__":
    sys.exit(main())
