"""Requeue cycles on the multi-node devcluster, under real SLURM time limits.

Runs `configs/tiny_gpt_2node.yaml` on N nodes (one task each) of the cluster
that `legato devcluster up --nodes M` started (M >= N), with its two-minute
limit and 30 s lead, so every stop is the real time-limit signal, and reads
from the run's ledger, for every requeue: when the signal came (seconds into
the attempt), and how long the cycle took from the signal to the verified
resume of the next attempt (checkpoint, `scontrol requeue`, SLURM's
credential wait, scheduling, start-up, restore, state hash check).

    python benchmarks/bench_multinode_requeue.py --nodes 2 --steps 2500 --out /tmp/bench2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from legato.events import Kind

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "tiny_gpt_2node.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--out", required=True, help="run directory (must not exist)")
    args = parser.parse_args()
    from legato.slurm.multinode import client_env

    run_dir = Path(args.out)
    if run_dir.exists():
        print(f"{run_dir} exists; give a new --out", file=sys.stderr)
        return 2
    started = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "legato.orchestrator.cli",
        "run",
        str(CONFIG),
        "--set",
        f"run.dir={run_dir}",
        "--set",
        f"slurm.nodes={args.nodes}",
        "--set",
        f"train.steps={args.steps}",
    ]
    code = subprocess.call(cmd, cwd=ROOT, env=client_env(), stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    events = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    attempts = [e for e in events if e["event"] == Kind.ATTEMPT_STARTED]
    signals = [
        min((e for e in events if e["event"] == Kind.STOP_SIGNAL and e["restart"] == a["restart"]), key=lambda e: e["time"], default=None)
        for a in attempts
    ]
    resumes = {e["restart"]: e for e in events if e["event"] == Kind.RESUMED}
    into, cycles = [], []
    for attempt, sig in zip(attempts, signals):
        if sig is None:
            continue
        into.append(sig["time"] - attempt["time"])
        nxt = resumes.get(attempt["restart"] + 1)
        if nxt:
            cycles.append(nxt["time"] - sig["time"])
    verified = all(r["match"] for r in resumes.values())
    print(
        f"exit {code}; {args.nodes} nodes x 1 task, {args.steps} steps, {len(attempts)} attempts, {wall:.0f}s wall; every resume "
        f"verified: {verified}"
    )
    print("signal s into attempt: " + ", ".join(f"{s:.0f}" for s in into))
    print(
        "signal -> verified resume s: "
        + ", ".join(f"{c:.1f}" for c in cycles)
        + (f" (median {statistics.median(cycles):.1f})" if cycles else "")
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
