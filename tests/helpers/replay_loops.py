"""User DDP loops on legato's public API that keep state outside the checkpoint, and the same loops with it registered.

Planted faults for the replay-verified resume (each one resumed a diverged run
with "verified ✓" before the replay existed):

- `prefetch`: the loop keeps the batch the session yielded and trains on the
  one it kept from the step before (a one-deep prefetch pipeline);
- `accumulate`: gradient accumulation over 3 micro-steps with DDP's
  `no_sync()`, one session step per micro-step, stopped between them;
- `generator`: noise from a `torch.Generator` the loop owns;
- `worker_rng`: augmentation drawn from the global torch RNG inside 2
  DataLoader workers.

`--register` makes each loop hand that state to the session (an extra with
state_dict/load_state_dict), or, for `worker_rng`, draw each sample's noise
from `legato.sample_generator`. `plain` keeps nothing outside.

Launch one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:

    python tests/helpers/replay_loops.py RUN_DIR --loop prefetch [--register] [--signal-at S] [--steps N]
        [--replay-steps K] [--replay-seconds T] [--replay-cost C] [--ballast-mb M] [--every-steps E] [--keep-last L]
        [--step-sleep S]

or call `train()` in one process (world size 1, no process group).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import legato

LOOPS = ("plain", "prefetch", "accumulate", "generator", "worker_rng")
SEED = 11
ACCUMULATE = 3


class Noisy(torch.utils.data.Dataset):
    """Regression samples with augmentation noise: from the global RNG (the fault) or from the sample's own generator."""

    def __init__(self, n: int, per_sample: bool) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = self.x.sum(1, keepdim=True)
        self.per_sample = per_sample
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = legato.sample_generator(SEED, self.epoch, i) if self.per_sample else None
        return self.x[i] + 0.1 * torch.rand(6, generator=gen), self.y[i]


class Staged:
    """The batch a prefetching loop keeps between steps."""

    def __init__(self) -> None:
        self.batch: list[torch.Tensor] | None = None

    def state_dict(self) -> dict:
        return {"batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.batch = state["batch"]


class Gradients:
    """The .grad sums of an unfinished accumulation."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())

    def state_dict(self) -> dict:
        return {"grads": [p.grad for p in self.params]}

    def load_state_dict(self, state: dict) -> None:
        for p, g in zip(self.params, state["grads"]):
            p.grad = None if g is None else g.clone()


class GeneratorState:
    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen

    def state_dict(self) -> dict:
        return {"state": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["state"])


def train(
    run_dir: Path,
    loop: str = "plain",
    *,
    register: bool = False,
    signal_at: tuple[int, ...] = (),
    steps: int = 12,
    replay_steps: int = 4,
    replay_seconds: float | None = None,
    replay_cost: float = 0.0,
    ballast_mb: int = 0,
    every_steps: int = 0,
    keep_last: int = 3,
    verify: str = "error",
    chaos: legato.Chaos | None = None,
    on_step: Callable[[legato.Session], None] | None = None,
) -> legato.Session:
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    legato.seed_everything(SEED, rank=rank, mode="fast")
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    if ballast_mb:  # a large state whose compute stays small: a frozen parameter, as a frozen embedding in fine-tuning
        model.register_parameter("ballast", torch.nn.Parameter(torch.randn(ballast_mb << 18), requires_grad=False))
    net = DDP(model) if distributed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = Noisy(96, per_sample=register or loop != "worker_rng")
    workers = 2 if loop == "worker_rng" else 0
    loader = legato.resumable_loader(dataset, batch_size=4, seed=SEED, rank=rank, world_size=world, num_workers=workers)
    staged, gradients, noise = Staged(), Gradients(model), torch.Generator().manual_seed(5)
    extras = {"prefetch": {"staged": staged}, "accumulate": {"grads": gradients}, "generator": {"noise": GeneratorState(noise)}}
    session = legato.Session(
        run_dir,
        model=net,
        optimizer=optimizer,
        loader=loader,
        total_steps=steps,
        extras=extras.get(loop, {}) if register else {},
        checkpoint=legato.CheckpointPolicy(
            hash_every_steps=1,
            agree_every_steps=1,
            replay_steps=replay_steps,
            replay_cost=replay_cost,  # 0 by default: the steps rule alone, bases where the tests expect them
            verify=verify,
            every_steps=every_steps,
            keep_last=keep_last,
            replay_seconds=replay_seconds,
        ),
        chaos=chaos or legato.Chaos(signal_rank=world - 1, signal_at_steps=signal_at),
    )
    for batch in session:
        if loop == "prefetch":
            current = staged.batch if staged.batch is not None else batch
            staged.batch = batch
            batch = current
        x, y = batch
        if loop == "generator":
            x = x + 0.1 * torch.randn(x.shape, generator=noise)
        sync = loop != "accumulate" or (session.step + 1) % ACCUMULATE == 0
        with net.no_sync() if distributed and not sync else contextlib.nullcontext():
            loss = F.mse_loss(net(x), y)
            (loss / ACCUMULATE if loop == "accumulate" else loss).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        session.report(loss)
        if on_step is not None:
            on_step(session)
    return session


def signal_in_replay(step: int) -> Callable[[legato.Session], None]:
    """A real SIGUSR2 from the last rank to itself while it replays `step`."""

    def hook(session: legato.Session) -> None:
        if session.replaying and session.step + 1 == step and session.rank == session.world_size - 1:
            os.kill(os.getpid(), signal.SIGUSR2)

    return hook


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--loop", choices=LOOPS, default="plain")
    parser.add_argument("--register", action="store_true")
    parser.add_argument("--signal-at", type=int, action="append", default=[])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--signal-in-replay", type=int, default=0, help="the last rank signals itself during this replayed step")
    parser.add_argument("--replay-steps", type=int, default=4)
    parser.add_argument("--replay-seconds", type=float, default=None)
    parser.add_argument("--replay-cost", type=float, default=0.0)
    parser.add_argument("--ballast-mb", type=int, default=0, help="a frozen parameter of this many MiB")
    parser.add_argument("--every-steps", type=int, default=0)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="every rank sleeps this long after each step (chaos)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo")
    try:
        session = train(
            Path(args.run_dir),
            args.loop,
            register=args.register,
            signal_at=tuple(args.signal_at),
            steps=args.steps,
            replay_steps=args.replay_steps,
            replay_seconds=args.replay_seconds,
            replay_cost=args.replay_cost,
            ballast_mb=args.ballast_mb,
            every_steps=args.every_steps,
            keep_last=args.keep_last,
            chaos=legato.Chaos(
                signal_rank=int(os.environ["WORLD_SIZE"]) - 1, signal_at_steps=tuple(args.signal_at), step_sleep_s=args.step_sleep
            ),
            on_step=signal_in_replay(args.signal_in_replay) if args.signal_in_replay else None,
        )
    except legato.ResumeMismatchError as exc:
        logging.error("%s", exc)
        return exc.exit_code
    finally:
        dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main())
