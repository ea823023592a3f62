"""`python -m legato.torchrun ARGS`: torchrun, except that ranks stopped at a checkpoint exit 75, not "failed".

torchrun reports any non-zero exit of a worker as a failure: a traceback, a
ChildFailedError summary and exit 1, so a stop at a committed checkpoint
(every rank exits 75, see `Session.exit_code`) cannot be told from a crash.
This runs torchrun itself (same arguments, same agent) and, when a rank
exited 75 and every other failed rank exited 75 too or was ended by the
agent's own SIGTERM (the agent ends the others as soon as one exits; a rank
exits 75 only after the checkpoint is published on every rank), says so in
one line and exits 75; likewise 3 when the ranks refused a resume that did
not verify, and 2 when legato refused what the script gave it (a UsageError,
said by the ranks); anything else is torchrun's own outcome.

One launch per attempt: run the same command again after a 75 (a loop in the
job script, or the scheduler's requeue). `--max-restarts N` instead makes the
agent restart the workers in place after a stop, which resumes them at once.
In-place restarts need a rendezvous whose store does not outlive an attempt:
torchrun's agent shares its TCP store with the workers, and the restarted
workers' gloo then reads the previous attempt's addresses from it and fails
with "Connection refused". So with `--max-restarts` > 0 this sets
`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (rank 0 of each attempt hosts a fresh
store) and refuses the static rendezvous, which always shares it.

Stop signals as schedulers send them. SLURM's `--signal=USR2@N` (no `B:`)
signals every process of the step, the launcher included, whose default
action for USR2 is to die; `scancel --signal` or `B:` may reach the launcher
alone, and torchrun's workers live in their own sessions, so nothing reaches
them. Here the stop signals (USR2, those named in `LEGATO_STOP_SIGNALS`, and
TERM) are blocked before anything starts: the ranks inherit the blocked mask,
so one that arrives before a rank's Session exists waits for its handler, and
the launcher takes them on a thread of its own (`sigwait`) and forwards each
to every rank (one that comes before the agent has started any rank is held
and sent as the ranks appear), then waits for their agreed checkpoint and
exits 75. TERM is
forwarded as the ranks' stop signal (the first of `LEGATO_STOP_SIGNALS`, else
USR2): a time limit's TERM then ends in a checkpoint, not in a kill, and the
ranks keep TERM blocked (the agent's own TERM to the ranks after a failure
turns into its SIGKILL after its grace). The ranks also learn the launcher's
pid, so a Session dies with it. Apart from that it
must never change what torchrun does to workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from legato.errors import EXIT_HUNG, EXIT_OK, EXIT_RESUME_MISMATCH, EXIT_STOPPED, EXIT_USAGE, UsageError
from legato.system.exiting import finish
from legato.system.launch_env import determinism_environ
from legato.system.lifeline import LAUNCHER_PID
from legato.system.processes import children
from legato.system.signals import parse_signal
from legato.voice import say

log = logging.getLogger(__name__)

# torchrun's switch for dynamic rendezvous: "1" gives each attempt's workers their own store instead of the agent's.
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# Extra stop signals for the launcher to take and forward, comma-separated names (as a Session's StopPolicy names them).
STOP_SIGNALS_ENV = "LEGATO_STOP_SIGNALS"
# How often the forwarder looks for ranks while it holds a stop that came before any rank existed.
HELD_POLL_S = 0.2


# Rank exits that are answers, not failures (the agent SIGTERMs the other ranks as soon as one exits): the launcher's line.
OUTCOMES = {
    EXIT_STOPPED: "every rank stopped at a committed checkpoint (exit %d); run the same command again to resume",
    EXIT_RESUME_MISMATCH: "the resume did not verify, see the paragraph above (exit %d); running again would fail the same way",
    EXIT_USAGE: "the script was refused what it was given, see the paragraph above (exit %d); fix that and run it again",
}


HUNG = (
    "the ranks made no progress and legato's hang watchdog ended them, their stacks are in the run directory's hangs/ "
    "(exit %d); run the same command again to resume from the newest checkpoint"
)


def stop_signals(environ: dict[str, str] | os._Environ) -> list[signal.Signals]:
    """The ranks' stop signals (those named in LEGATO_STOP_SIGNALS, else USR2), the first being the one TERM becomes."""
    names = [n for n in environ.get(STOP_SIGNALS_ENV, "").split(",") if n.strip()]
    return [parse_signal(n) for n in names] or [signal.SIGUSR2]


def forward_stops(stops: list[signal.Signals]) -> threading.Thread:
    """Take the stop signals and TERM (blocked in every thread) on a daemon thread and send each to every child
    process, TERM as the first stop signal.

    torchrun's agent runs in this process and starts the ranks as its children, so the children are the ranks. A stop
    that comes before the agent has started any rank (a preemption during a slow start) is kept and sent to the ranks
    as soon as they appear: lost, the job would train on until the scheduler kills it.
    """
    taken = {*stops, signal.SIGTERM}
    held: signal.Signals | None = None  # a stop that came before any rank existed

    def next_stop() -> signal.Signals | None:
        """The next stop signal taken; None when HELD_POLL_S passed while a stop is held (time to look for ranks)."""
        if held is None:
            return signal.Signals(signal.sigwait(taken))
        info = signal.sigtimedwait(taken, HELD_POLL_S)
        return None if info is None else signal.Signals(info.si_signo)

    def send(sig: signal.Signals, ranks: list[int]) -> None:
        for pid in ranks:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue

    def loop() -> None:
        nonlocal held
        while True:
            got = next_stop()
            ranks = children(os.getpid())
            if got is None:
                if ranks and held is not None:
                    say(log, 0, "the ranks have started: sending them the %s that came before them", held.name)
                    send(held, ranks)
                    held = None
                continue
            sig = stops[0] if got == signal.SIGTERM and got not in stops else got
            if not ranks:
                say(log, 0, "%s reached the launcher before any rank started: it goes to the ranks as they start", got.name)
                held = sig
                continue
            held = None  # this one reaches the ranks now
            news = "%s reached the launcher: sending %s to %d rank(s), which stop at the next agreed step"
            say(log, 0, news, got.name, sig.name, len(ranks))
            send(sig, ranks)

    thread = threading.Thread(target=loop, name="legato-stop-forwarder", daemon=True)
    thread.start()
    return thread


def _static_rendezvous(args: argparse.Namespace) -> bool:
    """Whether torchrun will use its static rendezvous (it switches a one-node launch without an address to c10d)."""
    from torch.distributed.run import parse_min_max_nnodes

    if args.standalone or args.rdzv_backend != "static":
        return False
    return bool(args.rdzv_endpoint) or args.master_port is not None or parse_min_max_nnodes(args.nnodes)[1] > 1


def prepare_in_place_restarts(args: argparse.Namespace, environ: dict[str, str] | os._Environ) -> None:
    """For `--max-restarts` > 0: refuse the static rendezvous, and give each attempt a store of its own."""
    if args.max_restarts <= 0:
        return
    if _static_rendezvous(args):
        raise UsageError(
            f"--max-restarts {args.max_restarts} restarts the workers in place, but torchrun's static rendezvous "
            "(what --master-port selects, and the default on several nodes) keeps one TCP store for every attempt, and the "
            "restarted workers' gloo reads the previous attempt's addresses from it and fails with \"Connection refused\". "
            "On one node drop --master-port (or add --standalone); on several nodes use --rdzv-backend c10d "
            "--rdzv-endpoint HOST:PORT; or keep --max-restarts 0 and run the same command again after each exit 75."
        )
    environ[UNSHARED_STORE] = "1"


def check_launch(args: argparse.Namespace) -> None:
    """What torchrun would only fail on inside its agent (a traceback per rank, or a bare AssertionError): one paragraph."""
    if not (args.module or args.no_python or os.path.isfile(args.training_script)):
        raise UsageError(
            f"python -m legato.torchrun: the training script {args.training_script} is not a file (seen from "
            f"{os.getcwd()}). Pass the path of your script, or -m and a module name."
        )
    nproc = str(args.nproc_per_node)
    if nproc.lstrip("-").isdigit() and int(nproc) < 1:
        raise UsageError(f"python -m legato.torchrun: --nproc-per-node {nproc} starts no rank. Pass 1 or more, or auto.")


def main(argv: list[str] | None = None) -> int:
    """torchrun with `argv`; returns 75 when every rank stopped at a committed checkpoint, else torchrun's outcome."""
    try:
        stops = stop_signals(os.environ)
    except UsageError as exc:
        say(log, 0, "%s", exc)
        return EXIT_USAGE
    # Before torch is imported (it starts threads): every later thread, and every rank, inherits the blocked mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, {*stops, signal.SIGTERM})
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_launch(args)
        prepare_in_place_restarts(args, os.environ)
    except UsageError as exc:
        say(log, 0, "%s", exc)
        return EXIT_USAGE
    os.environ.update(determinism_environ(os.environ))
    os.environ[LAUNCHER_PID] = str(os.getpid())
    forward_stops(stops)
    try:
        run(args)
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        if EXIT_HUNG in codes:  # the others then end as they may: lost peers, the agent's TERM, killed when stopped
            say(log, 0, HUNG, EXIT_HUNG)
            return EXIT_HUNG
        for code, news in OUTCOMES.items():
            if code in codes and codes <= {code, -signal.SIGTERM}:
                say(log, 0, news, code)
                return code
        raise
    return EXIT_OK


if __name__ == "__main__":
    finish(main)
