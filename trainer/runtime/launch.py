"""`python -m legato CONFIG --nproc N`: run the trainer on N local processes, no supervisor.

Starts N real processes (gloo on CPU), forwards the stop signal to all of
them, and exits with the job's code: 0 training complete, 75 stopped at a
committed checkpoint (run the same command again to resume), 124 ended by the
hang watchdog (run it again to resume), 2 bad input.
When one rank fails, the others are killed rather than left in a collective;
when the launcher dies (even by SIGKILL), its ranks die with it: each rank is
armed to die with the launcher before it execs (legato.system.lifeline), and
leads a process group of its own (its DataLoader workers join it) that the
launcher's exit path, whatever it is, kills whole.
"""

from __future__ import annotations

import argparse
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
from legato.quiet_args import Parser
from legato.runtime.entrypoint import check_entrypoint
from legato.store.manifest import check_tree
from legato.system.launch_env import determinism_environ
from legato.system.lifeline import LAUNCHER_PID, armed_child
from legato.system.signals import parse_signal

POLL_S = 0.05
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The local launcher's command line: CONFIG, `--nproc` and `--set KEY=VALUE` overrides."""
    parser = Parser(prog="python -m legato", description="Run the legato trainer locally on N processes.")
    parser.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    parser.add_argument("--nproc", type=int, default=None, help="number of ranks (default: local.tasks from the config)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m legato`: check the config, then run its ranks locally; the exit code."""
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
    procs: list[subprocess.Popen] = []
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
    prepare = _group_leader(armed_child())
    try:
        for rank in range(nproc):
            procs.append(subprocess.Popen(_rank_command(config, overrides), env=_rank_env(rank, nproc, port), preexec_fn=prepare))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop_signal})
        if received:
            forward(received[0], None)
        return _wait(procs)
    finally:
        # Whatever ends the launcher short of SIGKILL (an exception, Ctrl-C) ends every rank and worker with it.
        _kill_groups(procs)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop_signal})
        signal.signal(stop_signal, previous)


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


def _wait(procs: list[subprocess.Popen]) -> int:
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


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """After a rank failed: give the others a moment to end by themselves, then kill each with its workers."""
    deadline = time.monotonic() + KILL_GRACE_S
    for p in procs:
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if p.poll() is None:
            _kill_group(p)
            p.wait()


def _kill_groups(procs: list[subprocess.Popen]) -> None:
    """Kill every rank's process group (the rank and whatever it started), then reap the ranks."""
    for p in procs:
        _kill_group(p)
    for p in procs:
        p.wait()


def _kill_group(p: subprocess.Popen) -> None:
    # A rank leads its group, so the group's id is its pid; a group that is already empty is no error.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
