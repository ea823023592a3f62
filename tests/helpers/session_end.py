"""One rank of a DDP-tutorial loop that counts its gloo worker threads before, during and after a Session's loop.

    python tests/helpers/session_end.py OUT_DIR

Writes OUT_DIR/threads_rank<r>.json: {"before": n, "during": n, "after": n}, the threads named `pt_gloo_runloop`
(two per gloo process group) before the Session exists, at its last step, and once its loop has ended, whether
it ran its STEPS (environment, default 8) or stopped at a stop signal (exit code 75). Then it destroys the
process group and exits with the Session's code, as a script does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import legato

STEPS = int(os.environ.get("STEPS", "8"))


def gloo_threads() -> int:
    return sum((Path("/proc/self/task") / task / "comm").read_text().strip() == "pt_gloo_runloop" for task in os.listdir("/proc/self/task"))


GROUP_THREADS = 2  # gloo runloop threads per process group


def named_gloo_threads(deadline_s: float = 60.0) -> int:
    """The group's gloo threads once both have named themselves: each sets its own name after it starts, so a count
    taken right after init_process_group on a busy machine can see none or one of them yet (a CI run counted 1;
    bounded: what it sees at the deadline)."""
    end = time.monotonic() + deadline_s
    while (count := gloo_threads()) < GROUP_THREADS and time.monotonic() < end:
        time.sleep(0.01)
    return count


def main(out: Path) -> int:
    dist.init_process_group("gloo")
    legato.seed_everything(5, rank=dist.get_rank(), mode="fast")
    counts = {"before": named_gloo_threads()}
    model = torch.nn.Linear(16, 16)
    net = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = legato.Session(
        out, model=net, optimizer=optimizer, total_steps=STEPS, checkpoint=legato.CheckpointPolicy(every_minutes=0, agree_every_steps=1)
    )
    for step in session:
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
        F.mse_loss(net(x), x).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        counts["during"] = gloo_threads()
    counts["after"] = gloo_threads()
    (out / f"threads_rank{dist.get_rank()}.json").write_text(json.dumps(counts))
    dist.destroy_process_group()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
