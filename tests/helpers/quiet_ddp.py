"""One rank of a DDP loop whose boundaries may be quiet, or all loud, for the quiet boundary's multi-rank test.

    python tests/helpers/quiet_ddp.py RUN_DIR     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher)

30 steps of a tiny DDP model with a resumable loader; a checkpoint every 7 steps, a state hash every 5, a replay base
every 3, the ranks agreeing every 4 steps (AGREE_EVERY). STOP_AFTER=N: rank 1 sends itself the stop signal from inside
the body of step N. ALL_LOUD=1 sends every boundary down the general path (`Session._next_loud` is step + 1). Each
quiet boundary appends "step next_check" to RUN_DIR/quiet-rank<R>.txt (the agreement's next check then).
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import legato
from legato.dist.stop import StopAgreement
from legato.session.saving import Saver
from legato.session.session import Session

STOP_AFTER = int(os.environ.get("STOP_AFTER", "-1"))
AGREE_EVERY = int(os.environ.get("AGREE_EVERY", "4"))


def _watch_quiet_boundaries(out: Path) -> None:
    agreements: list[StopAgreement] = []
    made, quiet_end = StopAgreement.__init__, Saver.quiet_end

    def kept(self: StopAgreement, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        agreements.append(self)

    def written(self: Saver, *args) -> None:
        with out.open("a") as f:
            f.write(f"{self.position.step} {agreements[-1]._next_check}\n")
        quiet_end(self, *args)

    StopAgreement.__init__ = kept  # type: ignore[method-assign]
    Saver.quiet_end = written  # type: ignore[method-assign]


def main(run_dir: Path) -> int:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    if os.environ.get("ALL_LOUD") == "1":
        Session._next_loud = lambda self, step: step + 1  # type: ignore[method-assign]
    _watch_quiet_boundaries(run_dir / f"quiet-rank{rank}.txt")
    random.seed(rank)  # the RNGs a run saves start alike in both runs
    np.random.seed(rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    data = TensorDataset(torch.randn(240, 3, generator=torch.Generator().manual_seed(0)), torch.randn(240, 1))
    session = legato.Session(
        run_dir,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        total_steps=30,
        loader=legato.resumable_loader(data, batch_size=4, seed=1),
        checkpoint=legato.CheckpointPolicy(every_steps=7, hash_every_steps=5, replay_steps=3, replay_cost=0, agree_every_steps=AGREE_EVERY),
    )
    for x, y in session:
        loss = F.mse_loss(model(x), y)
        session.optimizer.zero_grad()
        loss.backward()
        session.optimizer.step()
        session.report(loss)
        if rank == 1 and session.step + 1 == STOP_AFTER:
            os.kill(os.getpid(), signal.SIGUSR2)
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
