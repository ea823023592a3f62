"""One rank whose gloo worker threads are starved of CPU while its script ends: it must still exit with its code.

    python tests/helpers/exit_race.py OUT_DIR

A Session runs one step over the world group; then the script pins every thread of the process and a busy
child to one CPU, puts gloo's worker threads in the SCHED_IDLE class, runs the world group's collectives and
exits with the Session's code right after the last one, keeping the group alive (as an FSDP2 model does past
`destroy_process_group()`). A worker preempted between finishing the last collective and dropping it then
takes the GIL during the interpreter's shutdown and aborts the process, unless the exit waited for it
(legato.dist.quiesce). With UNSETTLED=1 in the environment the script takes that wait away (the planted fault).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import legato
from legato.dist import quiesce
from legato.runtime.lifeline import armed_child

SPIN = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"


def starve_workers() -> subprocess.Popen:
    """Every thread of this process on CPU 0, gloo's workers at the lowest priority, and a child spinning there."""
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), {0})
        if Path(f"/proc/self/task/{task}/comm").read_text().strip() == quiesce.WORKER_THREAD:
            os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))
    return subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=armed_child())


def main(out: str) -> int:
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = legato.Session(out, model=model, optimizer=optimizer, total_steps=1)
    for _ in session:
        optimizer.step()
    if os.environ.get("UNSETTLED"):
        atexit.unregister(quiesce.settle)
    spinner = starve_workers()
    for _ in range(20):
        part, whole = torch.ones(1 << 12), torch.empty(1 << 12)
        dist.all_gather_into_tensor(whole, part)
        del part, whole  # the worker may now hold the last reference to both
    spinner.kill()
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
