"""`legato init DIR`: a start in one command: a training script already ported to legato, the job script that runs it
under SLURM and requeues it, and a config for `legato run`, each valid as written.

The script trains a small model on synthetic data so that it runs at once; its docstring and comments say which two
functions to replace with the user's own (`build`: model, optimizer, dataset; `fit`: the step). It is launched either
way: `python -m legato.torchrun --nproc-per-node N train.py RUN_DIR` (or srun: `main`), or `legato run config.yaml`
(`run`, called with the run context on every rank). The job script is the README's, with the requeue guard. Every
value that reaches a file is checked here first (names, numbers); nothing is written when one of the files exists
already, so a user's own file is never overwritten. This module must never import torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from legato.errors import UsageError
from legato.files import write_atomic

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
FILES = ("train.py", "job.sbatch", "config.yaml")

TRAIN_PY = '''"""A training script ported to legato, written by `legato init`: it stops at an agreed step on the scheduler's signal,
checkpoints, and resumes bit for bit, proving each resume.

Replace `build` (your model, optimizer and dataset) and `fit` (your step) with your own; keep the rest. Launch:

    python -m legato.torchrun --nproc-per-node {nproc} train.py runs/{name}     # here, or in job.sbatch under srun
    PYTHONPATH=. legato run config.yaml                                        # or supervised, from this folder

Exit 0: done; 75: stopped at a checkpoint (run the same command again to resume); 124: hung (stacks in the run
directory), resumed the same way.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import legato

SEED, STEPS, BATCH = 1234, {steps}, 32


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.Dataset]:
    """Your model, optimizer and dataset (this one: a small MLP on synthetic regression data)."""
    features = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
    targets = features @ torch.randn(16, 1, generator=torch.Generator().manual_seed(1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, torch.utils.data.TensorDataset(features, targets)


def fit(session: legato.Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Your training step, as in your plain loop; `session.report(loss)` records each step's exact loss."""
    for x, y in session:  # restores and verifies on entry; checkpoints; stops at the agreed step
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        session.report(loss)
    return session.exit_code


def run(ctx: legato.RunContext) -> int:
    """`legato run config.yaml` calls this on every rank, its process group and seeds set up."""
    model, optimizer, dataset = build()
    net = DDP(model) if ctx.world_size > 1 else model
    return fit(ctx.session(model=net, optimizer=optimizer, loader=ctx.loader(dataset, batch_size=BATCH)), net, optimizer)


def main() -> int:
    """`python -m legato.torchrun ... train.py RUN_DIR`, or srun, runs this on every rank."""
    if len(sys.argv) != 2:
        print("usage: train.py RUN_DIR (launched on every rank by python -m legato.torchrun or srun)", file=sys.stderr)
        return 2
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    legato.seed_everything(SEED, rank=rank, mode="strict")
    model, optimizer, dataset = build()
    net = DDP(model)
    loader = legato.resumable_loader(dataset, batch_size=BATCH, seed=SEED, rank=rank, world_size=world)
    session = legato.Session(sys.argv[1], model=net, optimizer=optimizer, loader=loader, total_steps=STEPS)
    code = fit(session, net, optimizer)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
'''

JOB_SBATCH = """#!/bin/bash
# Written by `legato init`: run train.py under SLURM, stop it at the time limit's signal, requeue it until done.
#   sbatch job.sbatch
# USR2 comes {lead_s} s before the time limit; legato.torchrun forwards it to every rank, which agree on a step,
# checkpoint and exit 75; `legato requeue` then requeues the job (within its budget, and only after progress).
#SBATCH --job-name={name}
#SBATCH --nodes=1 --ntasks-per-node=1
#SBATCH --time={time_min}
#SBATCH --requeue --open-mode=append --signal=USR2@{lead_s}
[ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && export LEGATO_RESUME=required   # a requeued attempt must find its checkpoint
trap 'echo "batch shell: SIGTERM (preemption); the ranks checkpoint first"' TERM
srun python -m legato.torchrun --nproc-per-node {nproc} train.py runs/{name}
exec legato requeue runs/{name} --exit-code $?
"""

CONFIG_YAML = """# Written by `legato init`: run train.py supervised, from this folder: PYTHONPATH=. legato run config.yaml
run:
  name: {name}
  dir: runs/{name}-supervised
executor: local            # slurm on a cluster (see the slurm: keys in `legato schema`)
local:
  tasks: {nproc}
train:
  entrypoint: "train:run"
  steps: {steps}
  batch_size: 32
determinism:
  seed: 1234
  mode: strict
"""


@dataclass(frozen=True)
class Starter:
    """What `legato init` fills in: the run's name, ranks per node, steps, and the job's time and signal lead."""

    name: str = "exp1"
    nproc: int = 2
    steps: int = 200
    time_min: int = 60
    lead_s: int = 120

    def check(self) -> None:
        if not NAME.fullmatch(self.name):
            raise UsageError(
                "legato init: --name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (it "
                "names the run directory and the job). Pick such a name."
            )
        for flag, value, low in (("--nproc", self.nproc, 1), ("--steps", self.steps, 1), ("--time-min", self.time_min, 2)):
            if value < low:
                raise UsageError(f"legato init: {flag} must be at least {low}. Give a larger value.")
        if self.lead_s >= 60 * self.time_min:
            raise UsageError("legato init: the signal's lead must be shorter than the job's time limit. Lower it or raise --time-min.")

    def files(self) -> dict[str, str]:
        """Each file's name and text."""
        values = {"name": self.name, "nproc": self.nproc, "steps": self.steps, "time_min": self.time_min, "lead_s": self.lead_s}
        return {
            "train.py": TRAIN_PY.replace("{nproc}", str(self.nproc)).replace("{name}", self.name).replace("{steps}", str(self.steps)),
            "job.sbatch": JOB_SBATCH.format(**values),
            "config.yaml": CONFIG_YAML.format(**values),
        }


def write(folder: Path, starter: Starter) -> list[Path]:
    """Write the three files into `folder` (made if missing); refused, writing nothing, when any of them exists."""
    starter.check()
    existing = [name for name in FILES if (folder / name).exists()]
    if existing:
        raise UsageError(
            f"legato init: {folder} already has {', '.join(existing)}; nothing was written (legato init never overwrites a "
            "file). Pick another folder, or move those files away."
        )
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"legato init: {folder} is a file, not a folder. Pick a folder (it is made if missing).")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in starter.files().items():
        write_atomic(folder / name, text)
        written.append(folder / name)
    (folder / "job.sbatch").chmod(0o755)
    return written
