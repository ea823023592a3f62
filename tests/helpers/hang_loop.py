"""One rank of a DDP-tutorial loop with a 2-worker DataLoader, for hangs planted from outside or in its own code.

    python tests/helpers/hang_loop.py OUT_DIR     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher)

STEPS (default 40) steps of a tiny DDP model, each sleeping STEP_SLEEP_S (default 0.1) so that a test can stop a
process mid-run, a checkpoint every 4 steps. DEADLOCK_AT=N plants a deadlock in the user's own code: the loop takes
a lock it already holds at step N on rank DEADLOCK_RANK (default 0), in attempts up to DEADLOCK_ATTEMPTS (default
1). VALIDATE_AT=N has rank 0 compute alone for VALIDATE_S seconds at step N (a validation) while the others wait in
a barrier: activity, not a hang. START_DELAY_S sleeps before anything else (a start-up that outlasts a stop signal's
lead). EVERY_MINUTES (default 10) is checkpoint.every_minutes: a number, or `auto`. SLOW_RANK=R with SLOW_FORWARD_S
makes rank R's forward pass that much slower (a straggler). BALLAST_MB adds that much state per rank that training
never changes (an EMA copy's size, say), so that writing a checkpoint takes long enough to be caught in the act.
Exits with the Session's code (the watchdog's 124 ends a hung attempt itself).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import legato

STEPS = int(os.environ.get("STEPS", "40"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.1"))
DEADLOCK_AT = int(os.environ.get("DEADLOCK_AT", "-1"))
DEADLOCK_RANK = int(os.environ.get("DEADLOCK_RANK", "0"))
DEADLOCK_ATTEMPTS = int(os.environ.get("DEADLOCK_ATTEMPTS", "1"))
VALIDATE_AT = int(os.environ.get("VALIDATE_AT", "-1"))
VALIDATE_S = float(os.environ.get("VALIDATE_S", "0"))
START_DELAY_S = float(os.environ.get("START_DELAY_S", "0"))
EVERY_MINUTES = os.environ.get("EVERY_MINUTES", "10")
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_FORWARD_S = float(os.environ.get("SLOW_FORWARD_S", "0"))
BALLAST_MB = int(os.environ.get("BALLAST_MB", "0"))


class Ballast:
    """State a checkpoint writes and training never changes: BALLAST_MB of float32 per rank."""

    def __init__(self, rank: int) -> None:
        self.values = torch.full((BALLAST_MB * 2**18,), float(rank))

    def state_dict(self) -> dict:
        return {"values": self.values}

    def load_state_dict(self, state: dict) -> None:
        self.values.copy_(state["values"])


class Linear(torch.nn.Linear):
    """The model; on rank SLOW_RANK its forward sleeps SLOW_FORWARD_S first (a slower host), its state unchanged."""

    def __init__(self, *args: int, slow_s: float = 0.0) -> None:
        super().__init__(*args)
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.slow_s)
        return super().forward(x)


def user_code_that_deadlocks(lock: threading.Lock) -> None:
    with lock:
        lock.acquire()  # the planted bug: a non-reentrant lock taken twice


def validate_on_rank0(rank: int) -> None:
    end = time.monotonic() + VALIDATE_S
    while rank == 0 and time.monotonic() < end:
        sum(i * i for i in range(10_000))
    dist.barrier()


def main(out: Path) -> int:
    time.sleep(START_DELAY_S)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    legato.seed_everything(11, rank=rank, mode="fast")
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data, seed=3)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
    model = DDP(Linear(8, 1, slow_s=SLOW_FORWARD_S if rank == SLOW_RANK else 0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    session = legato.Session(
        out,
        model=model,
        optimizer=optimizer,
        loader=loader,
        total_steps=STEPS,
        extras={"ballast": Ballast(rank)} if BALLAST_MB else None,
        checkpoint=legato.CheckpointPolicy(every_steps=4, every_minutes=EVERY_MINUTES if EVERY_MINUTES == "auto" else float(EVERY_MINUTES)),
    )
    lock = threading.Lock()
    for x, y in session:
        if session.step == DEADLOCK_AT and rank == DEADLOCK_RANK and session.attempt <= DEADLOCK_ATTEMPTS and not session.replaying:
            user_code_that_deadlocks(lock)
        if session.step == VALIDATE_AT:
            validate_on_rank0(rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        session.report(loss)
        time.sleep(STEP_SLEEP_S)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
