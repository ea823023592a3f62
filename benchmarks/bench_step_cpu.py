"""The Session's own CPU per step: a loop whose body does almost nothing, plain and under a Session at its defaults.

What is left when the training step costs nothing is what legato adds to every step of every run: the batch's
fingerprint, the step record, the trajectory line, the stop agreement's check, the hang watchdog's mark. Rows,
alternating within each round, each the median over the rounds:

- plain: the same body (a 4-sample batch through `Linear(4, 1)`, DDP's with ranks, backward, SGD step, `loss.item()`)
  with no Session;
- legato Session, defaults: `CheckpointPolicy()` with the final checkpoint outside the timed steps, the body's
  `loss.item()` reported;
- legato Session, report(loss): the same, the loss tensor itself reported (as the README's loop does; the plain row's
  `loss.item()` is then the Session's);
- plain + unrelated Python: the plain body and a few microseconds of Python that is not legato's (json, re) after it,
  its cost when hot printed above the table: the calibration row. Any Python between two steps runs cold and leaves
  the body colder; this row shows by how much on this machine, so the Session's rows can be read against it;
- plain + a spin: the plain body and a busy wait as long as the calibration's Python when hot, touching no memory and
  calling nothing but the clock: where it costs as much as the calibration row, what any Python between two steps adds
  comes from the delay itself (a rank later to its collective), not from cold caches;
- plain again (the control row: the noise floor).

Above the table, the hot costs: the calibration's Python a call, and a Session's loop at the defaults whose body only
reports a float (its boundary alone, warm).

Each row is, per step over `--steps` steps after `--warm`: the CPU time of the whole process (every thread); the CPU
of the loop, this thread's plus legato's own threads' (named `legato-*`), without gloo's threads, whose CPU at two
ranks moved by more than the Session's whole cost from one row to the next; and the wall time. `--world 2` runs two
ranks (gloo) and reports rank 0.

    python benchmarks/bench_step_cpu.py [--world 1] [--steps 2000] [--warm 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.runtime.launch import free_port
from legato.session.session import CheckpointPolicy, Session


class Body:
    """The near-empty training step both rows run (under DDP when there are ranks to reduce over, as a user's is)."""

    def __init__(self, world: int = 1) -> None:
        torch.manual_seed(0)
        linear = torch.nn.Linear(4, 1)
        self.model: torch.nn.Module = DDP(linear) if world > 1 else linear
        self.opt = torch.optim.SGD(linear.parameters(), lr=0.01)
        self.x, self.y = torch.randn(4, 4), torch.randn(4, 1)

    def step(self) -> float:
        return self.step_tensor().item()

    def step_tensor(self) -> torch.Tensor:
        loss = F.mse_loss(self.model(self.x), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


Figures = tuple[float, float, float]  # process CPU, loop CPU, wall: seconds per step


def _unrelated() -> None:
    """A few microseconds of Python that has nothing to do with legato or torch (the calibration row's)."""
    record = {"step": 1, "loss_hex": (0.25).hex(), "lr": 0.1, "batch": [1, 2, 3]}
    json.dumps(record)
    re.match(r"\d+", "123abc")
    sorted(record)


def _spin(seconds: float) -> None:
    """Wait `seconds` busily, calling nothing but the clock (the spin row's)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _hot_cost(call: Callable[[], None], times: int = 20_000) -> float:
    """CPU seconds per call of `call` run back to back (hot)."""
    began = time.thread_time()
    for _ in range(times):
        call()
    return (time.thread_time() - began) / times


def _loop_cpu() -> float:
    """CPU seconds of this thread and of legato's own threads so far."""
    total = time.thread_time()
    for thread in threading.enumerate():
        if thread.name.startswith("legato") and thread.ident is not None:
            with contextlib.suppress(OSError, ProcessLookupError):  # a thread that ended since the listing
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def _timed(steps: Iterable[int], step: Callable[[], Any], report: Callable[[Any], None] | None, warm: int, last: int) -> Figures:
    """Per step of steps `warm` to `last` (the last step, whose boundary is a final checkpoint, out)."""
    marks: list[Figures] = []
    for i in steps:
        if i in (warm, last):
            marks.append((time.process_time(), _loop_cpu(), time.perf_counter()))
        loss = step()
        if report is not None:
            report(loss)
    (cpu0, loop0, wall0), (cpu1, loop1, wall1), n = marks[0], marks[1], last - warm
    return (cpu1 - cpu0) / n, (loop1 - loop0) / n, (wall1 - wall0) / n


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, tmp: str, out: dict) -> None:
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    body, total = Body(world), args.warm + args.steps
    unrelated_hot = _hot_cost(_unrelated)

    def barrier() -> None:
        if world > 1:
            dist.barrier()

    def plain(r: int) -> Figures:
        barrier()
        return _timed(range(total), body.step, None, args.warm, total - 1)

    def plain_then(extra: Callable[[], None]) -> Callable[[int], Figures]:
        """A row of the plain body with `extra` after each step."""

        def row(r: int) -> Figures:
            barrier()

            def step() -> float:
                loss = body.step()
                extra()
                return loss

            return _timed(range(total), step, None, args.warm, total - 1)

        return row

    def session(r: int, step: Callable[[], Any] = body.step, name: str = "item") -> Figures:
        barrier()
        s = Session(
            Path(tmp) / f"session-{name}-{r}", model=body.model, optimizer=body.opt, total_steps=total, checkpoint=CheckpointPolicy()
        )
        return _timed(s, step, s.report, args.warm, total - 1)

    rows: dict[str, Callable[[int], Figures]] = {
        "legato Session, defaults": session,
        "legato Session, report(loss)": lambda r: session(r, body.step_tensor, "tensor"),
        "plain + unrelated Python": plain_then(_unrelated),
        "plain + a spin as long": plain_then(functools.partial(_spin, unrelated_hot)),
        "plain (control)": plain,
    }
    found: dict[str, list[Figures]] = {"plain": [], **{name: [] for name in rows}}
    for r in range(args.rounds + 1):  # round 0 warms up and is not counted
        before = plain(r)
        names = list(rows)
        names = names[r % len(names) :] + names[: r % len(names)]
        measured = {name: rows[name](r) for name in names}
        if r:
            found["plain"].append(before)
            for name, value in measured.items():
                found[name].append(value)
    barrier()
    bare = Session(Path(tmp) / "bare", model=body.model, optimizer=body.opt, total_steps=total, checkpoint=CheckpointPolicy())
    bare_figures = _timed(bare, lambda: 0.25, bare.report, args.warm, total - 1)
    if rank == 0:
        out["unrelated, hot"] = unrelated_hot
        out["session, hot"] = bare_figures[1]
        out.update({name: tuple(statistics.median(column) for column in zip(*v)) for name, v in found.items()})
    if world > 1:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=1, help="ranks (1: no process group)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.steps < 2 or args.warm < 1 or args.world < 1:
        print("--steps must be at least 2, --warm and --world at least 1.", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.world} rank(s), 1 thread each; {args.steps} steps after {args.warm}")
    print(f"process CPU, loop CPU (this thread and legato's) and wall per step, medians over {args.rounds} rounds; added = row - plain")
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        out = manager.dict()
        if args.world == 1:
            _worker(0, 1, 0, args, tmp, out)
        else:
            mp.spawn(_worker, args=(args.world, free_port(), args, tmp, out), nprocs=args.world, join=True)
        print(f"hot: the calibration row's unrelated Python {out.pop('unrelated, hot') * 1e6:.1f} µs a call; a Session's loop with no")
        print(f"     training step {out.pop('session, hot') * 1e6:.1f} µs of loop CPU a step")
        plain = out["plain"]
        heads = ("process CPU µs", "loop CPU µs", "wall µs")
        print(f"   {'row':<28} " + " ".join(f"{head:>14} {'added':>8}" for head in heads))
        for name, figures in dict(out).items():
            cells = (f"{value * 1e6:14.1f} {(value - base) * 1e6:+8.1f}" for value, base in zip(figures, plain))
            print(f"   {name:<28} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
