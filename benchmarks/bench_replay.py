"""Benchmark of the replay-verified resume: snapshot cost per step and replay cost per resume, beside the plain loop.

1. Per-step time, one process (the snapshot is rank-local work, no
   collectives): the plain loop, the same loop under a Session with the replay
   off (`replay_steps: 0`), and with K = 2, 4, 8, 16. Blocks alternate, and
   each is compared with the replay-off block run just before it, so the drift
   of a shared machine cancels out. Each block ends with a checkpoint, which is
   left out (measured in bench_core.py).
2. The parts of that cost: one snapshot (copy of every component into the
   reused CPU memory, steady state) and one step record (batch fingerprint,
   loss bits, the held-batch watch), and the overhead they predict, copy/K +
   record, as a share of the plain step.
3. Replay per resume: the time from the start of the resumed iteration to the
   first new step, resuming a checkpoint with the replay off (load N) and on
   (load B, replay N-B steps, compare), for the worst case N-B = K.

    python benchmarks/bench_replay.py [--steps 96] [--rounds 9] [--batch 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from legato.session.replay import fingerprint, step_record
from legato.session.session import Chaos, CheckpointPolicy, Session, resumable_loader
from legato.state import components as table
from legato.state.snapshot import Snapshot, batch_tensors
from legato.store import layout

KS = (2, 4, 8, 16)


class Bench:
    def __init__(self, steps: int, batch: int, tmp: Path) -> None:
        torch.manual_seed(0)
        self.steps, self.batch = steps, batch
        n = batch * steps
        self.data = torch.utils.data.TensorDataset(torch.randn(n, 256), torch.randn(n, 1))
        self.model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tmp = tmp
        self.blocks = 0

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss

    def loader(self) -> torch.utils.data.DataLoader:
        return resumable_loader(self.data, self.batch, seed=self.blocks)

    def plain(self) -> float:
        loader = self.loader()
        start = time.perf_counter()
        for x, y in loader:
            self.step(x, y)
        return (time.perf_counter() - start) / self.steps

    def session(self, k: int, run_dir: Path | None = None, verify: str = "error", **kwargs) -> tuple[float, Session]:
        self.blocks += 1
        run_dir = run_dir or self.tmp / f"run{self.blocks}"
        policy = CheckpointPolicy(hash_every_steps=0, replay_steps=k, verify=verify)
        session = Session(
            run_dir, model=self.model, optimizer=self.opt, loader=self.loader(), total_steps=self.steps, checkpoint=policy, **kwargs
        )
        start = time.perf_counter()
        for x, y in session:
            session.report(self.step(x, y))
        spent = time.perf_counter() - start - (session.last_checkpoint.seconds if session.last_checkpoint else 0.0)
        return spent / self.steps, session


def per_step(b: Bench, rounds: int) -> dict[str, list[float]]:
    """name -> per-round ratio against the replay-off block run just before it (plain: its own seconds)."""
    names = ["plain", *(f"K={k}" for k in KS)]
    ratios: dict[str, list[float]] = {n: [] for n in ["replay off", *names]}
    seconds: dict[str, list[float]] = {n: [] for n in ratios}
    for r in range(rounds + 1):  # round 0 warms up
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            off, _ = b.session(0)
            value = b.plain() if name == "plain" else b.session(int(name[2:]))[0]
            if r:
                seconds["replay off"].append(off)
                seconds[name].append(value)
                ratios[name].append(value / off)
    return {
        "seconds": {n: statistics.median(v) for n, v in seconds.items()},
        "ratio": {n: statistics.median(v) for n, v in ratios.items() if v},
    }


def parts(b: Bench, repeats: int = 30) -> dict[str, float]:
    """Median seconds of one steady-state snapshot and one step record."""
    _, session = b.session(4)
    rows = session.components
    snap = Snapshot()
    parts = table.capture(rows)
    snap.take(0, parts, layout.files(rows, parts, 0), set())  # allocates; later takes reuse
    takes, records = [], []
    x, y = next(iter(b.loader()))
    for i in range(repeats):
        start = time.perf_counter()
        parts = table.capture(rows)
        snap.take(i, parts, layout.files(rows, parts, 0), set())
        takes.append(time.perf_counter() - start)
        start = time.perf_counter()
        tensors = batch_tensors([x, y])
        step_record(i, 0.5, fingerprint(tensors), None)
        session._saving.base.held.yielded(tensors)
        session._saving.base.held.step_ended(i)
        records.append(time.perf_counter() - start)
    state = sum(
        t.numel() * t.element_size()
        for t in [*b.model.parameters(), *(v for s in b.opt.state.values() for v in s.values() if torch.is_tensor(v))]
    )
    return {"snapshot": statistics.median(takes), "record": statistics.median(records), "bytes": state}


def resume_cost(b: Bench, k: int, repeats: int) -> dict[str, float]:
    """Seconds from the start of a resumed iteration to its first new step: replay off vs on (N-B = K)."""
    out: dict[str, list[float]] = {"load N": [], f"load B, replay {k} steps": []}
    for i in range(repeats):
        for name, replay_k in (("load N", 0), (f"load B, replay {k} steps", k)):
            run_dir = b.tmp / f"resume{i}_{replay_k}"
            stop_after = 2 * k  # a multiple of K, so the base is K steps back
            # A stop under verify "error" holds its state only as its replay base (a resume must replay it); under
            # "warn" it also writes N's own state, which the replay-off resume loads.
            b.session(k, run_dir, verify="warn" if replay_k == 0 else "error", chaos=Chaos(signal_at_steps=(stop_after,)))
            b.blocks -= 1  # the same data order for the resume
            policy = CheckpointPolicy(hash_every_steps=0, replay_steps=replay_k)
            session = Session(run_dir, model=b.model, optimizer=b.opt, loader=b.loader(), total_steps=b.steps, checkpoint=policy)
            start = time.perf_counter()
            for x, y in session:
                if not session.replaying and session.step > stop_after - 1:
                    out[name].append(time.perf_counter() - start)
                    break
                session.report(b.step(x, y))
            b.blocks += 1
    return {n: statistics.median(v) for n, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_replay_") as tmp:
        return run(args, Bench(args.steps, args.batch, Path(tmp)))


def run(args: argparse.Namespace, b: Bench) -> int:
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {args.threads} thread(s); MLP 256-1024-1024-1 + AdamW, batch {args.batch}")

    measured = per_step(b, args.rounds)
    print(
        f"\n1. per-step time, 1 process; overhead = median over {args.rounds} rounds of (block / adjacent replay-off block), "
        f"{args.steps} steps a block"
    )
    for name, seconds in measured["seconds"].items():
        ratio = measured["ratio"].get(name)
        vs = "" if ratio is None else f"   vs replay off {100 * (ratio - 1):+6.2f}%"
        print(f"   {name:<12} {seconds * 1e3:8.3f} ms/step{vs}")

    p = parts(b)
    plain = measured["seconds"]["plain"]
    print(f"\n2. parts, median of 30: state {p['bytes'] / 2**20:.1f} MiB (params + AdamW moments)")
    print(f"   snapshot (copy into reused memory)   {p['snapshot'] * 1e3:7.3f} ms  {p['bytes'] / 2**30 / p['snapshot']:6.2f} GiB/s")
    print(f"   step record (fingerprint, watch)     {p['record'] * 1e3:7.3f} ms  {100 * p['record'] / plain:5.2f}% of a plain step")
    for k in KS:
        predicted = (p["snapshot"] / k + p["record"]) / plain
        print(f"   predicted overhead at K={k:<2}          {100 * predicted:6.2f}%")

    k = 4
    resume = resume_cost(b, k, args.repeats)
    print(f"\n3. resume to the first new step, median of {args.repeats} (plain step {plain * 1e3:.2f} ms)")
    for name, seconds in resume.items():
        print(f"   {name:<28} {seconds * 1e3:8.2f} ms  = {seconds / plain:6.1f} plain steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
