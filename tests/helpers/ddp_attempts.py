"""One rank of a reducer-level experiment: does a fresh DDP wrapper (a new attempt) reduce like the old one?

    python tests/helpers/ddp_attempts.py RANK WORLD PORT OUT.json

Each rank trains a small transformer for `STEPS` steps with one plain DDP
wrapper (the uninterrupted run), and again with a fresh model, optimizer and
DDP wrapper built from the state after `CUT` steps (the resumed attempt), once
with the bucket layout the first wrapper had at the cut restored (legato's
`BucketLayout`) and once with the fresh wrapper's own. Rank 0 writes the
parameter digests after every step of each run. Real gloo, real processes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.dist.reduction import BucketLayout

STEPS, CUT = 4, 2


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(torch.nn.Embedding(20, 16), layer, torch.nn.Linear(16, 20))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.contiguous().numpy().tobytes())
    return h.hexdigest()


def train(net: DDP, opt: torch.optim.Optimizer, rank: int, steps: range) -> list[str]:
    out = []
    for i in steps:
        x = torch.randint(0, 20, (4, 8), generator=torch.Generator().manual_seed(1000 * i + rank))
        loss = net(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(digest(net.module))
    return out


def run(rank: int, restore: bool) -> dict:
    model = build()
    net = DDP(model)
    uninterrupted = train(net, torch.optim.SGD(model.parameters(), lr=0.1), rank, range(STEPS))
    model = build()
    net = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(net, opt, rank, range(CUT))
    state, opt_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    layout = BucketLayout(net).state_dict()
    assert layout["buckets"] is not None
    model = build()
    model.load_state_dict(state)
    net = DDP(model)
    if restore:
        BucketLayout(net).load_state_dict(layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.load_state_dict(opt_state)
    resumed = train(net, opt, rank, range(CUT, STEPS))
    return {"uninterrupted": uninterrupted[CUT:], "resumed": resumed}


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {"restored": run(rank, True), "ddp_default": run(rank, False)}
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
