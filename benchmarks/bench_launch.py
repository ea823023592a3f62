"""Start-up cost of a launch: from the command to its exit, for a one-step 2-rank run, measured side by side in one run.

What a user pays on every attempt before training goes on: the launcher, two ranks that each import torch, the
process group, the Session's restore or fresh start, one step and the final checkpoint. Rows, interleaved round by
round (each round runs every row once, in a shuffled order):

- `torchrun` + a plain DDP script of one step (the anchor);
- `python -m legato CONFIG --nproc 2` on the bundled MLP at its defaults (strict determinism), `train.steps=1`;
- `legato run CONFIG` on the local executor, the same run (the supervisor, submitit's controller, one task that
  forks the two ranks): what `legato run` adds around a launch on a laptop;
- `python -m legato.torchrun` + the same plain script (legato's torchrun wrapper alone);
- `torchrun` + the plain script again: the control row, whose ratio shows the noise floor.

Each row reports the median wall time and the median CPU seconds, and both as ratios to the anchor. The CPU is the
whole machine's busy time while the row ran (`/proc/stat`: `legato run`'s submitit controller is no child this process
reaps, so the children's own times would miss it); the control row shows what else the machine did. Where there is no
`/proc/stat`, the children's user + system time.

    python benchmarks/bench_launch.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROC_STAT = Path("/proc/stat")
PLAIN = """
import os
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
F.cross_entropy(model(x), y).backward()
optimizer.step()
dist.destroy_process_group()
# Gloo's threads sometimes abort the interpreter's teardown under torchrun ("terminate called without an active
# exception"), which is not what is measured here.
os._exit(0)
"""


def rows(work: Path) -> dict[str, list[str]]:
    """Each row's command line."""
    plain = work / "plain.py"
    plain.write_text(PLAIN)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(plain)]
    config = str(ROOT / "configs" / "mlp.yaml")
    sets = ["--set", "train.steps=1", "--set", "chaos.signal_at_steps=[]", "--set", f"run.dir={work / 'run'}"]
    legato = [sys.executable, "-m", "legato", config, "--nproc", "2", *sets]
    supervised = [sys.executable, "-m", "legato.orchestrator.cli", "run", config, "--set", "local.tasks=2", *sets]
    wrapper = [sys.executable, "-m", "legato.torchrun", "--standalone", "--nproc-per-node", "2", str(plain)]
    return {
        "torchrun + plain script (anchor)": torchrun,
        "python -m legato, MLP, defaults": legato,
        "legato run, local executor, MLP, defaults": supervised,
        "python -m legato.torchrun + plain script": wrapper,
        "torchrun + plain script (control)": torchrun,
    }


def timed(cmd: list[str], work: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (every descendant's user + system) of one run; the run must exit 0."""
    subprocess.run(["rm", "-rf", str(work / "run")], check=True)
    before = busy_cpu()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - start
    after = busy_cpu()
    if proc.returncode != 0:
        sys.exit(f"{cmd[2]} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, after - before


def busy_cpu() -> float:
    """The machine's busy CPU seconds so far (user, nice, system), or this process's children's where /proc has none."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
    except OSError:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    return sum(int(v) for v in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_launch_") as tmp:
        work = Path(tmp)
        commands = rows(work)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        shuffle = random.Random(0)
        for _ in range(args.rounds):
            order = list(commands)
            shuffle.shuffle(order)
            for name in order:
                results[name].append(timed(commands[name], work))
    walls = {name: statistics.median(w for w, _ in runs) for name, runs in results.items()}
    cpus = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    anchor = next(iter(commands))
    print(f"start-up of a one-step 2-rank run, {args.rounds} round(s), medians; ratios to {anchor}")
    print(f"  {'row':44s} {'wall s':>7s} {'ratio':>6s} {'CPU s':>7s} {'ratio':>6s}")
    for name in commands:
        print(f"  {name:44s} {walls[name]:7.2f} {walls[name] / walls[anchor]:5.2f}x {cpus[name]:7.2f} {cpus[name] / cpus[anchor]:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
