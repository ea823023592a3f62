"""`python -m legato CONFIG --nproc N`: run the trainer on N local processes, no supervisor.

Starts N real processes (gloo on CPU), forwards the stop signal to all of
them, and exits with the job's code: 0 training complete, 75 stopped at a
committed checkpoint (run the same command again to resume), 124 ended by the
hang watchdog (run it again to resume), 2 bad input.
When one rank fails, the others are killed rather than left in a collective;
when the launcher dies (even by SIGKILL), its ranks die with it: each rank is
armed to die with the launcher before one line of it runs (legato.system.lifeline),
and leads a process group of its own (its DataLoader workers join it) that the
launcher's exit path, whatever it is, kills whole.
On Linux the launcher imports what every rank imports (torch, the trainer, what
DDP imports as it wraps a model) once, and forks the ranks from itself
(legato.system.forking), where each would import it again: about 3 s of CPU per
rank on a small machine. It first runs itself again in place with the ranks'
PYTHONHASHSEED, which an interpreter reads only as it starts.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from legato.config import load_config
from legato.errors import EXIT_FAILED, EXIT_HUNG, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UsageError
from legato.paths import RunPaths
from legato.runtime.entrypoint import check_entrypoint
from legato.runtime.launch_args import parse_args
from legato.store.manifest import check_tree
from legato.system.forking import FORKS, ForkedProcess, fork_run, fresh_numpy_seed, name_this_process
from legato.system.launch_env import determinism_environ
from legato.system.lifeline import LAUNCHER_PID, armed_child
from legato.system.signals import parse_signal

POLL_S = 0.05
Rank = subprocess.Popen | ForkedProcess
LOWEST_RENDEZVOUS_PORT = 10000  # above the well-known and most registered services' ports
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
KILL_GRACE_S = 5.0


def free_port() -> int:
    """A TCP port that was free a moment ago, for the ranks' rendezvous, drawn at random below the ephemeral range.

    Rank 0 listens on it seconds later, after importing torch. A port of the kernel's ephemeral range (where a bind to
    port 0 lands) can be taken in between as the source port of any outgoing connection, and gloo's ranks open many: a
    launch failed that way (EADDRINUSE) in a loaded test run. Below that range only an explicit bind can take it.
    """
    low = _ephemeral_low()
    # Drawn from the OS, not the global `random`: a launcher's choice must not move the seeded state of the process.
    draw = random.SystemRandom()
    draws = [draw.randrange(LOWEST_RENDEZVOUS_PORT, low) for _ in range(32)] if low > LOWEST_RENDEZVOUS_PORT else []
    for port in [*draws, 0]:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free TCP port for the ranks' rendezvous")


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def main(argv: list[str] | None = None) -> int:
    """`python -m legato`: check the config, then run its ranks locally; the exit code."""
    if argv is None:
        _with_the_ranks_hash_seed()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # --nproc N is local.tasks=N: every rank then validates the config against the world size it runs in.
    overrides = [*args.overrides, f"local.tasks={args.nproc}"] if args.nproc is not None else list(args.overrides)
    try:
        if args.nproc is not None and args.nproc < 1:
            raise UsageError(f"--nproc is {args.nproc}; it must be at least 1.")
        cfg = load_config(args.config, overrides)
        check_entrypoint(cfg)
        check_tree(RunPaths(cfg.run_dir).checkpoints)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    return run_local(Path(args.config), overrides, cfg.local.tasks, stop_signal=parse_signal(cfg.slurm.signal))


def run_local(config: Path, overrides: list[str], nproc: int, stop_signal: signal.Signals) -> int:
    """Start `nproc` rank processes of `config`, forwarding `stop_signal` to them; the job's exit code (a failed rank stops the rest)."""
    port = free_port()
    procs: list[Rank] = []
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    # The ranks inherit the blocked mask: a stop signal during their start-up waits for their handler
    # (which unblocks it) instead of killing them. The mask covers only this thread: torch's threads may take
    # the signal while ranks are still being started, so one that came then is sent again to every rank after.
    signal.pthread_sigmask(signal.SIG_BLOCK, {stop_signal})
    previous = signal.signal(stop_signal, forward)
    try:
        start = _starter(_rank_command(config, overrides), _group_leader(armed_child()), stop_signal)
        for rank in range(nproc):
            procs.append(start(_rank_env(rank, nproc, port)))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop_signal})
        if received:
            forward(received[0], None)
        return _wait(procs)
    finally:
        # Whatever ends the launcher short of SIGKILL (an exception, Ctrl-C) ends every rank and worker with it.
        _kill_groups(procs)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop_signal})
        signal.signal(stop_signal, previous)


def _with_the_ranks_hash_seed() -> None:
    """Run this launcher again, in place (same pid), with the ranks' PYTHONHASHSEED if it lacks it: the seed is read
    only as an interpreter starts, and a rank forked from this process keeps this process's."""
    if not FORKS or _has_the_ranks_hash_seed():
        return
    seed = determinism_environ(os.environ)["PYTHONHASHSEED"]
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "PYTHONHASHSEED": seed})


def _has_the_ranks_hash_seed() -> bool:
    """Whether this interpreter started with the PYTHONHASHSEED its ranks get (the one setting a fork cannot give them)."""
    return os.environ.get("PYTHONHASHSEED") == determinism_environ(os.environ)["PYTHONHASHSEED"]


def _starter(command: list[str], prepare: Callable[[], None], stop_signal: signal.Signals) -> Callable[[dict[str, str]], Rank]:
    """How this launcher starts a rank with its environment: forked from this process once it imported what every rank
    imports, where this process started as the ranks' interpreter would (their PYTHONHASHSEED); else `command` in a
    fresh interpreter. Either way the rank leads its own process group and dies with the launcher (`prepare`)."""
    if not FORKS or not _has_the_ranks_hash_seed():
        return lambda env: subprocess.Popen(command, env=env, preexec_fn=prepare)
    rank_main, rank_file = preloaded_rank()

    def start(env: dict[str, str]) -> Rank:
        def become() -> None:
            prepare()
            name_this_process(f"legato-rank{env['RANK']}")  # its command line is the launcher's: `ps -o pid,comm` tells them apart
            os.environ.clear()
            os.environ.update(env)
            sys.argv = [rank_file, *command[3:]]  # as `python -m legato.runtime.rank ...` sets it
            fresh_numpy_seed()

        return fork_run(command, become, rank_main, default_handlers=[stop_signal])

    return start


def preloaded_rank() -> tuple[Callable[[], int], str]:
    """The rank's entry and its file, once this process imported what each rank would import again: torch, legato's
    trainer, and what DistributedDataParallel imports as it wraps a model (3 s of CPU a rank on a small machine).
    None of these imports starts a Python thread: the forks copy no thread but the one that forks."""
    import torch._dynamo  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    from legato.runtime import rank

    return rank.main, str(rank.__file__)


def _group_leader(arm: Callable[[], None] | None) -> Callable[[], None]:
    """What a rank runs between fork and exec: it leads a process group of its own (which its DataLoader workers join,
    and which the launcher's exit path kills whole), then arms its parent-death signal. Popen's process_group= does
    the first only from Python 3.11; legato supports 3.10."""

    def prepare() -> None:
        os.setpgid(0, 0)
        if arm is not None:
            arm()

    return prepare


def _rank_command(config: Path, overrides: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "legato.runtime.rank", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def _rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(determinism_environ(os.environ))
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **{LAUNCHER_PID: str(os.getpid())},
    )
    return env


def _wait(procs: list[Rank]) -> int:
    """Wait for every rank; if one fails, stop the rest. Returns the job's exit code."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c is not None and c not in (EXIT_OK, EXIT_STOPPED)]
        if failed:
            _kill_all(procs)
            return _job_code(failed)
        done = [c for c in codes if c is not None]
        if len(done) == len(codes):
            return _job_code(done)
        time.sleep(POLL_S)


def _job_code(codes: list[int]) -> int:
    if all(c == EXIT_OK for c in codes):
        return EXIT_OK
    if all(c == EXIT_STOPPED for c in codes):
        return EXIT_STOPPED
    if EXIT_USAGE in codes:
        return EXIT_USAGE
    if EXIT_HUNG in codes:  # the watchdog's answer; the other ranks then lose their peer or are killed
        return EXIT_HUNG
    real = [c for c in codes if c not in (EXIT_OK, EXIT_STOPPED)]
    if real and real[0] > 0:
        return real[0]
    return EXIT_FAILED


def _kill_all(procs: list[Rank]) -> None:
    """After a rank failed: give the others a moment to end by themselves, then kill each with its workers."""
    deadline = time.monotonic() + KILL_GRACE_S
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if p.poll() is None:
            _kill_group(p)
            p.wait()


def _kill_groups(procs: list[Rank]) -> None:
    """Kill every rank's process group (the rank and whatever it started), then reap the ranks."""
    for p in procs:
        _kill_group(p)
    for p in procs:
        p.wait()


def _kill_group(p: Rank) -> None:
    # A rank leads its group, so the group's id is its pid; a group that is already empty is no error.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
