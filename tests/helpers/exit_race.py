"""Two ranks whose script ends while rank 0's gloo worker still holds the last collective's work and waits for the
GIL to let go of it: rank 0 must still exit with its code.

    python tests/helpers/exit_race.py OUT_DIR

This is the loaded machine's race (legato.dist.quiesce), held open on purpose so it happens every time. A Session runs
one step over the world group. Rank 0's first exit hook starts one more collective (async), drops every Python
reference to it and its tensors, so its worker holds the last ones, and keeps the GIL (a switch interval of a day, a
busy wait with no system call). Rank 1 joins that collective only then; rank 0's worker finishes it and waits for the
GIL to drop the tensors' Python objects. The next exit hook is legato's wait: it frees the GIL, the worker drops its
work and parks, and the rank exits with its code. With UNSETTLED=1 in the environment that wait is taken away (the
planted fault): the interpreter finalizes first, frees the GIL while it clears modules, and the worker aborts the rank.

Every other exit hook is cleared first, so that none frees the GIL by chance and only the wait under test decides;
rank 0 writes to OUT_DIR/settle_registered whether legato had registered its wait by itself. The group stays alive
past the script, as an FSDP2 model keeps the world group past `destroy_process_group()`.
"""

from __future__ import annotations

import atexit
import mmap
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import legato
from legato.dist import quiesce

# Rank 0 holds the GIL this long after rank 1's side of the last collective ended, so its worker surely waits for it.
HOLD_AFTER_PEER_S = 1.0
# Neither rank waits longer than this for the other (a test's bounded wait, never reached in a working run).
WAIT_AT_MOST_S = 120.0
GATE, ENDED = 0, 1
# The shared bytes, kept until the interpreter clears this module: unmapping them closes a file, which frees the GIL.
SHARED: list[mmap.mmap] = []


class FreesTheGilInShutdown:
    """Sleeps in its finalizer, which runs as the interpreter clears this module, after no other thread may run Python:
    a shutdown that frees the GIL for a while (as closing files does), so a worker that waits for it surely gets it."""

    def __del__(self, sleep=time.sleep) -> None:  # the module's `time` may be gone by then
        sleep(0.5)


FREES_THE_GIL_IN_SHUTDOWN = FreesTheGilInShutdown()


def last_collective() -> dist.Work:
    """An all-gather rank 0's worker will finish after this rank let go of everything it touched."""
    part, whole = torch.ones(1 << 12), torch.empty(dist.get_world_size() << 12)
    return dist.all_gather_into_tensor(whole, part, async_op=True)


def flags(out: Path) -> mmap.mmap:
    """The two bytes the ranks share without a system call: GATE (rank 0 holds the GIL) and ENDED (rank 1's side ended)."""
    with (out / "flags").open("r+b") as file:
        return mmap.mmap(file.fileno(), 2)


def peer(shared: mmap.mmap) -> None:
    """Rank 1: join the last collective once rank 0 holds the GIL, then tell it the collective ended."""
    deadline = time.monotonic() + WAIT_AT_MOST_S
    while shared[GATE] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    last_collective().wait()
    shared[ENDED] = 1


def hold_the_gil_until_the_worker_waits() -> None:
    """Rank 0's first exit hook: start the last collective, drop it, and keep the GIL until the worker is done and
    wants it. From the gate on nothing here makes a system call, which would free the GIL for the worker too early."""
    work = last_collective()
    del work  # the worker now holds the last references to the work and its tensors
    sys.setswitchinterval(86400.0)
    SHARED[0][GATE] = 1
    deadline = time.monotonic() + WAIT_AT_MOST_S
    while SHARED[0][ENDED] == 0 and time.monotonic() < deadline:
        pass
    hold = time.monotonic() + HOLD_AFTER_PEER_S
    while time.monotonic() < hold:
        pass


def only_the_wait_under_test(out: Path) -> None:
    """Clear every exit hook, note whether legato had registered its wait, and leave two: the hold first, then legato's
    wait (unless UNSETTLED asks for the planted fault)."""
    (out / "settle_registered").write_text(str(quiesce._registered))
    atexit._clear()
    if not os.environ.get("UNSETTLED"):
        atexit.register(quiesce.settle)
    atexit.register(hold_the_gil_until_the_worker_waits)  # the last registered runs first


def main(out: Path) -> int:
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        (out / "flags").write_bytes(bytes(2))  # before the Session's collectives, so rank 1 finds it after them
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = legato.Session(out, model=model, optimizer=optimizer, total_steps=1)
    for _ in session:
        optimizer.step()
    SHARED.append(flags(out))
    if dist.get_rank() == 1:
        peer(SHARED[0])
    else:
        only_the_wait_under_test(out)
    return session.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
