"""One rank of user loops that bring their own loader and own state (launch one process per rank, gloo).

    python tests/helpers/byo_loops.py RUN_DIR --loop owned|iterable [--signal-before-loop]

- `owned`: the user's DataLoader with torch's DistributedSampler, its own
  `generator=` and `worker_init_fn=` (which marks every sample, to prove it
  ran), 2 workers drawing augmentation from the global RNG, gradient
  accumulation over 3 session steps with DDP's `no_sync()`, and noise from a
  `torch.Generator`, a `numpy.random.Generator` and a `random.Random` passed
  to `extras` as they are.
- `iterable`: a DataLoader over an IterableDataset that saves its own
  position (`state_dict`/`load_state_dict`), no workers, epochs of unknown
  length.
- `zero`: the `iterable` loop with a ZeroRedundancyOptimizer (Adam, sharded
  over the ranks) and a StepLR on it.

`--signal-before-loop`: the last rank sends itself SIGUSR2 right after the
Session is created, before the loop (stops are otherwise planted through
LEGATO_CHAOS_SIGNAL_AT). Each rank writes its final parameter digest to
RUN_DIR/params_rank<R>.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler

import legato

ACCUMULATE = 3
MARK = 7.0


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = self.x.sum(1, keepdim=True)
        self.mark = 0.0  # set by the user's worker_init_fn in each worker

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noisy = self.x[i] + 0.1 * torch.rand(6) + 0.01 * float(np.random.rand())
        return torch.cat([noisy, torch.tensor([self.mark])]), self.y[i]


def mark_worker(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.mark = MARK


class Stream(IterableDataset):
    """A stream of samples that knows its own position (and rank), resumable by state_dict."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 7, generator=gen)[rank::world]
        self.position = 0

    def __iter__(self):
        while self.position < len(self.x):
            self.position += 1
            yield self.x[self.position - 1], self.x[self.position - 1, :1]
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--loop", choices=("owned", "iterable", "zero"), default="owned")
    parser.add_argument("--signal-before-loop", action="store_true")
    parser.add_argument("--verify", choices=("error", "warn"), default="error", help="CheckpointPolicy(verify=...)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    random.seed(3 + rank)
    np.random.seed(3 + rank)
    torch.manual_seed(3 + rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    net = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = None
    if args.loop == "zero":
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    noise_t, noise_np, noise_py = torch.Generator().manual_seed(5), np.random.default_rng(6), random.Random(7)
    if args.loop == "owned":
        dataset = Augmented(96)
        loader = DataLoader(
            dataset,
            batch_size=4,
            sampler=DistributedSampler(dataset, seed=2),
            num_workers=2,
            generator=torch.Generator().manual_seed(9),
            worker_init_fn=mark_worker,
        )
        extras = {"noise_t": noise_t, "noise_np": noise_np, "noise_py": noise_py}
    else:
        loader = DataLoader(Stream(80, rank, world), batch_size=4)
        extras = {}
    session = legato.Session(
        args.run_dir,
        model=net,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
        total_steps=30,
        extras=extras,
        checkpoint=legato.CheckpointPolicy(verify=args.verify),
    )
    if args.signal_before_loop and rank == world - 1:
        os.kill(os.getpid(), signal.SIGUSR2)
    for x, y in session:
        if args.loop == "owned":
            assert bool((x[:, -1] == MARK).all()), "the user's worker_init_fn did not run"
            x = x + 0.01 * torch.randn(x.shape, generator=noise_t) + float(noise_np.normal()) * 1e-3 + noise_py.random() * 1e-3
        sync = args.loop != "owned" or (session.step + 1) % ACCUMULATE == 0
        with contextlib.nullcontext() if sync else net.no_sync():
            loss = F.mse_loss(net(x), y)
            (loss / ACCUMULATE if args.loop == "owned" else loss).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        session.report(loss)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    (args.run_dir / f"params_rank{rank}.txt").write_text(digest)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main())
