"""Per-step cost of a Session at its defaults as the state grows while the compute stays the same, side by side in one run.

What a user with a large state runs: a 2-rank gloo DDP loop whose trainable model (an MLP, its step held at the same
compute for every size) sits beside a frozen parameter of `--mb` MiB per rank (a frozen embedding or backbone, as in
fine-tuning: in every checkpoint, trained by nobody), first plain, then under `legato.Session` at its defaults
(`CheckpointPolicy()`), then with the defaults before 2026-11-29 (`hash_every_steps=10` and `replay_cost=0`: the state
hashed every 10 steps, a replay base copied every 32 steps whatever it costs), then plain again (the control row: the
noise floor). Blocks of every row alternate within each size; each block is divided by the plain block run just before
it and the medians are printed.

A block is `--warm` steps and then `--steps` timed ones, in one Session (its start-up, its first replay bases and its
final checkpoint fall outside the timed steps, and are measured by bench_defaults.py). Beside each Session row, what
its timed steps did that grows with the state, counted by wrapping the digest and the base copy (each counts a few
integers a call): MiB hashed and MiB copied into replay bases per 100 steps, and the copies. At the defaults a step
that saves nothing hashes no state, and a base is copied once its copy costs at most 2% of the steps since the last
(docs/exactness.md): a larger state takes fewer copies and replays longer on a resume.

    python benchmarks/bench_state_size.py [--mb 16 256 1024] [--steps 400] [--warm 40] [--rounds 3] [--hidden 768]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from legato.runtime.launch import free_port
from legato.session.session import CheckpointPolicy, Session
from legato.state import hashing
from legato.state.snapshot import Snapshot

BATCH = 64


class Counts:
    """What the timed steps of one block hashed and copied (the wraps below add to it while `on`)."""

    def __init__(self) -> None:
        self.on = False
        self.hashed = 0
        self.copied = 0
        self.copies = 0


COUNTS = Counts()


def _count() -> None:
    """Wrap the one digest of every tensor and the replay base's copy so that the timed steps' work is counted."""
    digest, take = hashing.raw_digest, Snapshot.take

    def counted_digest(data: Any) -> bytes:
        if COUNTS.on:
            COUNTS.hashed += memoryview(data).nbytes
        return digest(data)

    def counted_take(self: Snapshot, *args: Any) -> None:
        take(self, *args)
        if COUNTS.on:
            COUNTS.copies += 1
            COUNTS.copied += sum(t.nbytes for t in (*self._own.values(), *self._replicated.values()))

    hashing.raw_digest = counted_digest  # type: ignore[assignment]
    Snapshot.take = counted_take  # type: ignore[method-assign]


def _model(hidden: int, mb: int) -> torch.nn.Module:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )
    model.register_parameter("frozen", torch.nn.Parameter(torch.zeros(mb << 18), requires_grad=False))
    return model


class _Rows:
    """One state size's model, optimizer and batches, and the rows that train them: plain, or under a Session."""

    def __init__(self, mb: int, args: argparse.Namespace, batches: list[tuple[torch.Tensor, torch.Tensor]], tmp: str) -> None:
        torch.manual_seed(0)
        self.mb, self.args, self.batches, self.tmp = mb, args, batches, tmp
        self.model = DDP(_model(args.hidden, mb))
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        self.total = args.warm + args.steps

    def step(self, i: int) -> torch.Tensor:
        x, y = self.batches[i % len(self.batches)]
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def plain(self, r: int) -> tuple[float, Counts]:
        """Seconds per timed step of the plain loop."""
        dist.barrier()
        marks = []
        for i in range(self.total):
            if i >= self.args.warm - 1:
                marks.append(time.perf_counter())
            self.step(i)
        marks.append(time.perf_counter())
        return (marks[-1] - marks[0]) / self.args.steps, Counts()

    def session(self, policy: CheckpointPolicy, label: str) -> Callable[[int], tuple[float, Counts]]:
        """A Session's row: seconds per timed step (the final checkpoint's boundary left out) and the counts."""

        def run(r: int) -> tuple[float, Counts]:
            global COUNTS
            dist.barrier()
            COUNTS = Counts()
            s = Session(
                Path(self.tmp) / f"{self.mb}-{label}-{r}",
                model=self.model,
                optimizer=self.opt,
                total_steps=self.total,
                checkpoint=policy,
                ignore=[COUNTS],
            )
            marks = []
            for i, _ in enumerate(s):
                if i == self.args.warm - 1:
                    COUNTS.on = True  # from this step's boundary on (it runs when the loop asks for the next step)
                if i >= self.args.warm - 1:
                    marks.append(time.perf_counter())
                s.report(self.step(i))
                if i == self.total - 2:
                    COUNTS.on = False  # the last step's boundary writes the final checkpoint: not a step that saves nothing
            return (marks[-1] - marks[0]) / self.args.steps, COUNTS

        return run


def _size(rows: _Rows, rounds: int) -> dict[str, tuple[float, float, float, float, float]]:
    """Every row of one size, alternating with plain blocks; rank 0's medians (ms/step, ratio, MiB hashed and copied per
    100 steps, copies a block)."""
    variants: dict[str, Callable[[int], tuple[float, Counts]]] = {
        "legato Session, defaults": rows.session(CheckpointPolicy(), "defaults"),
        "  defaults before 2026-11-29": rows.session(CheckpointPolicy(hash_every_steps=10, replay_cost=0), "before"),
        "plain (control)": rows.plain,
    }
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    counted: dict[str, list[Counts]] = {name: [] for name in variants}
    plain_times: list[float] = []
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        before, _ = rows.plain(r)
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]
        measured = {name: variants[name](r) for name in names}
        if r:
            plain_times.append(before)
            for name, (seconds, counts) in measured.items():
                ratios[name].append(seconds / before)
                counted[name].append(counts)
    base, per100 = statistics.median(plain_times), 100 / rows.args.steps
    found = {"plain": (base, 1.0, 0.0, 0.0, 0.0)}
    for name, v in ratios.items():
        c = counted[name]
        found[name] = (
            base * statistics.median(v),
            statistics.median(v),
            statistics.median(x.hashed for x in c) * per100 / 2**20,
            statistics.median(x.copied for x in c) * per100 / 2**20,
            statistics.median(x.copies for x in c),
        )
    return found


def _worker(rank: int, port: int, args: argparse.Namespace, tmp: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    _count()
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 256, generator=g), torch.randint(0, 10, (BATCH,), generator=g)) for _ in range(16)]
    del g  # drawn from once, before any Session
    for mb in args.mb:
        found = _size(_Rows(mb, args, batches, tmp), args.rounds)
        if rank == 0:
            out[mb] = found
            print(f"   {mb} MiB done", flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, nargs="+", default=[16, 256, 1024], help="frozen state per rank, MiB")
    parser.add_argument("--steps", type=int, default=400, help="timed steps a block")
    parser.add_argument("--warm", type=int, default=40, help="steps a block before the timed ones (past the first replay bases)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=768, help="the MLP's width: the step's compute")
    args = parser.parse_args()
    if args.warm < 2 or args.steps < 2:
        print(
            "--warm and --steps must be at least 2: a block times the steps between its warm-up and its final checkpoint.", file=sys.stderr
        )
        return 2
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 2 ranks (gloo), 1 thread each, batch {BATCH}, MLP width {args.hidden} + AdamW"
    )
    print(
        f"per-step time of {args.steps} steps after {args.warm}; "
        f"overhead = median over {args.rounds} rounds of (row / adjacent plain block)"
    )
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), args, tmp, out), nprocs=2, join=True)
        print(f"   {'state/rank':>10}  {'row':<30} {'ms/step':>9} {'overhead':>9} {'MiB hashed':>11} {'MiB copied':>11} {'copies':>7}")
        print(f"   {'':>10}  {'':<30} {'':>9} {'':>9} {'/100 steps':>11} {'/100 steps':>11} {'/block':>7}")
        for mb in args.mb:
            for name, (seconds, ratio, hashed, copied, copies) in out[mb].items():
                figures = f"{seconds * 1e3:9.2f} {100 * (ratio - 1):+8.2f}% {hashed:11.1f} {copied:11.1f} {copies:7.0f}"
                print(f"   {mb:>6} MiB  {name:<30} {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
