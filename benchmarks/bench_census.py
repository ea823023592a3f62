"""Benchmark of the census of unsaved state: what each look costs, beside a training step and a garbage collection.

The census runs at an attempt's start, beside its first and last checkpoints, and (its plain-object look alone) at
the end of the attempt's first two trained steps; never on any other step. This measures, in one process with torch
imported and a timm-style loop's objects on the stack (a model, an EMA, an optimizer, meters, a best-checkpoint saver,
and `--objects` more plain objects of the user's), each part of a look, side by side with the anchors:

- a training step of the loop's model (what a look costs in steps);
- `gc.collect()` (the sweep's share: the census confirms what only the collector saw with one collection);
- the census by kind (`find_unsaved`: the walk of the user's variables and the collector sweep), in this process
  (as in a rank started cold: torchrun's, srun's) and in a child legato forks after the imports (`fork_run`, as the
  local launcher and a local job fork their ranks: what the parent imported is left out of the sweep);
- the plain-object look (`legato.state.plain.fingerprints`), and the same again as a control row.

    python benchmarks/bench_census.py [--rounds 7] [--objects 2000] [--blocks 1]

`--blocks` repeats the model's MLP block: 40 give 160 parameter tensors, about a ResNet-50's count. The optimizer's state
is keyed by those tensors, and the looks' cost follows their number.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from legato.state.census import find_unsaved
from legato.state.plain import fingerprints
from legato.system.forking import fork_run


class Meter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0


class Saver:
    def __init__(self) -> None:
        self.checkpoint_files: list[tuple[float, str]] = [(0.5, "checkpoint-0.pth.tar")]
        self.best_epoch, self.best_metric = 0, 0.5


def mlp_block() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))


def timed(fn: Callable[[], object], rounds: int) -> float:
    """The median of `rounds` timings of `fn`, in seconds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def census_in_a_forked_rank(blocks: int, objects: int, rounds: int) -> float:
    """The census by kind's median in a child `fork_run` forks from this process (which has imported what a rank
    imports and made nothing yet), over the same loop's objects made in the child."""
    read, write = os.pipe()

    def rank() -> int:
        os.close(read)
        seconds = timed_census(*loop_objects(blocks, objects), rounds)
        os.write(write, repr(seconds).encode())
        return 0

    child = fork_run(["bench_census rank"], lambda: None, rank)
    os.close(write)
    with os.fdopen(read) as result:
        seconds = float(result.read())
    assert child.wait() == 0
    return seconds


def loop_objects(blocks: int, objects: int) -> tuple[list[object], list[object]]:
    """A timm-style loop's objects: (what it registers, what else it holds: meters, a saver, more plain objects)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(mlp_block() for _ in range(blocks)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    held = [{"loss": Meter(), "top1": Meter()}, Saver(), [Meter() for _ in range(objects)]]
    return [model, optimizer, ema], held


def timed_census(registered: list[object], held: list[object], rounds: int) -> float:
    frame = sys._getframe()  # the walk starts here: `registered` and `held` are its locals
    return timed(lambda: find_unsaved(registered, frame=frame), rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--objects", type=int, default=2000, help="more plain objects of the user's, in a list on the stack")
    parser.add_argument("--blocks", type=int, default=1, help="MLP blocks in the model, 4 parameter tensors each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    forked = census_in_a_forked_rank(args.blocks, args.objects, args.rounds)
    registered, held = loop_objects(args.blocks, args.objects)
    model, optimizer = registered[0], registered[1]
    assert isinstance(model, torch.nn.Module) and isinstance(optimizer, torch.optim.Optimizer)
    x = torch.randn(64, 256)
    frame = sys._getframe()

    def step() -> None:
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()
    rows = [
        ("training step (anchor)", timed(step, args.rounds)),
        ("gc.collect() (anchor)", timed(gc.collect, args.rounds)),
        ("census by kind (find_unsaved)", timed_census(registered, held, args.rounds)),
        ("census by kind, in a forked rank", forked),
        ("plain-object look (fingerprints)", timed(lambda: fingerprints(registered, frame), args.rounds)),
        ("plain-object look (control)", timed(lambda: fingerprints(registered, frame), args.rounds)),
    ]
    found = len(fingerprints(registered, frame))
    step_s = rows[0][1]
    tensors = len(list(model.parameters()))
    print(f"census costs, median of {args.rounds}, {found} plain objects, {tensors} parameter tensors, torch {torch.__version__}")
    for name, seconds in rows:
        print(f"  {name:<36} {seconds * 1e3:9.2f} ms   {seconds / step_s:7.2f} training steps")


if __name__ == "__main__":
    main()
