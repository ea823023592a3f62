"""One rank of loops over users' loaders, recording every batch they see (launch one process per rank, gloo).

    python tests/helpers/loader_loops.py RUN_DIR --loop stateful-map|stateful-iterable|cycle|epochs
        [--workers N] [--start-method fork|forkserver|spawn] [--persistent] [--plain]

- `stateful-map`: torchdata's StatefulDataLoader over a map-style dataset with
  torch's DistributedSampler; augmentation drawn from the global torch and
  numpy RNGs in `__getitem__`; `total_epochs=`.
- `stateful-iterable`: a StatefulDataLoader over an IterableDataset that
  splits its rank's stream over the workers and saves its position
  (`state_dict`), with a `__len__`; `total_epochs=`.
- `cycle`: the diffusion trainers' pattern, k=2 loader batches per optimizer
  step from an endless `cycle(dl)` over a DataLoader with a DistributedSampler
  on which nobody calls `set_epoch`; with legato, one session step per
  micro-batch and DDP's `no_sync()` on the first.
- `epochs`: the epoch form with the loop's own `sampler.set_epoch(epoch)` and
  `enumerate(session.batches(), start=session.step_in_epoch)`.

`--persistent` keeps the workers of torch's DataLoader from one epoch to the
next (`persistent_workers=True`; `cycle` and `epochs` only). `--plain` runs the same loop without legato (`cycle` and `epochs` only). Each
rank appends one line per batch to RUN_DIR/batches_rank<R>.jsonl (step, the
loop's own index, the batch's sha256 and sample indices; nothing while a resume replays) and
writes its final parameter digest to RUN_DIR/params_rank<R>.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler

ACCUMULATE = 2
OPTIMIZER_STEPS = 10  # cycle: 20 micro-batches, 6 a rank's epoch: past epoch 3
EPOCHS = 3


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i] + 0.1 * torch.rand(6) + 0.01 * float(np.random.rand()), self.y[i], i


class Stream(IterableDataset):
    """This rank's samples, split over the workers; each copy knows its position within its share."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 6, generator=gen)[rank::world]
        self.position = 0

    def __len__(self) -> int:
        return len(self.x)

    def __iter__(self):
        info = get_worker_info()
        share = self.x if info is None else self.x[info.id :: info.num_workers]
        while self.position < len(share):
            self.position += 1
            yield share[self.position - 1], share[self.position - 1].sum(0, keepdim=True)
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def cycle(loader):
    while True:
        yield from loader


class Recorder:
    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / f"batches_rank{rank}.jsonl"

    def __call__(self, step: int, index: int, batch: tuple[torch.Tensor, ...]) -> None:
        digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in batch)).hexdigest()
        samples = batch[2].tolist() if len(batch) == 3 else None
        with self.path.open("a") as out:
            out.write(json.dumps({"step": step, "index": index, "batch": digest, "samples": samples}) + "\n")


def build_loader(args: argparse.Namespace, rank: int, world: int):
    context = {"multiprocessing_context": args.start_method} if args.workers and args.start_method else {}
    if args.loop.startswith("stateful"):
        from torchdata.stateful_dataloader import StatefulDataLoader

        if args.loop == "stateful-iterable":
            return StatefulDataLoader(Stream(80, rank, world), batch_size=4, num_workers=args.workers, **context)
        dataset = Augmented(96)
        return StatefulDataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=2), num_workers=args.workers, **context)
    dataset = Augmented(48)
    return DataLoader(
        dataset,
        batch_size=4,
        sampler=DistributedSampler(dataset, seed=2),
        num_workers=args.workers,
        persistent_workers=args.persistent,
        **context,
    )


def train_step(net: DDP, optimizer: torch.optim.Optimizer, batch, sync: bool, scale: float) -> torch.Tensor:
    x, y = batch[0], batch[1]
    with contextlib.nullcontext() if sync else net.no_sync():
        loss = F.mse_loss(net(x), y)
        (loss * scale).backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss


def plain(args, net, optimizer, loader, record) -> int:
    if args.loop == "cycle":
        batches = cycle(loader)
        for step in range(OPTIMIZER_STEPS):
            for micro in range(ACCUMULATE):
                batch = next(batches)
                record(step * ACCUMULATE + micro, -1, batch)
                train_step(net, optimizer, batch, micro == ACCUMULATE - 1, 1 / ACCUMULATE)
        return 0
    step = 0
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for i, batch in enumerate(loader):
            record(step, i, batch)
            train_step(net, optimizer, batch, True, 1.0)
            step += 1
    return 0


def with_legato(args, run_dir, net, optimizer, loader, record) -> int:
    import legato

    if args.loop == "cycle":
        session = legato.Session(run_dir, model=net, optimizer=optimizer, loader=loader, total_steps=OPTIMIZER_STEPS * ACCUMULATE)
        for batch in session:  # one session step per micro-batch
            last = (session.step + 1) % ACCUMULATE == 0
            if not session.replaying:
                record(session.step, -1, batch)
            session.report(train_step(net, optimizer, batch, last, 1 / ACCUMULATE))
        return session.exit_code
    session = legato.Session(run_dir, model=net, optimizer=optimizer, loader=loader, total_epochs=EPOCHS)
    for epoch in session.epochs():
        if args.loop == "epochs":
            loader.sampler.set_epoch(epoch)
        for i, batch in enumerate(session.batches(), start=session.step_in_epoch):
            if not session.replaying:
                record(session.step, i, batch)
            session.report(train_step(net, optimizer, batch, True, 1.0))
    return session.exit_code


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--loop", choices=("stateful-map", "stateful-iterable", "cycle", "epochs"), required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--start-method", choices=("fork", "forkserver", "spawn"))
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    np.random.seed(3 + rank)
    torch.manual_seed(3 + rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    net = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = build_loader(args, rank, world)
    record = Recorder(args.run_dir, rank)
    code = plain(args, net, optimizer, loader, record) if args.plain else with_legato(args, args.run_dir, net, optimizer, loader, record)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    (args.run_dir / f"params_rank{rank}.txt").write_text(digest)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
