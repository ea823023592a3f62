"""The subcommands that carry a run: `legato run`, `watch`, `train` (no scheduler), `cancel` and `requeue`.

Each `cmd_*` takes the parsed arguments and returns the exit code; the workflows live in the modules that own them
(supervisor.py, control.py, local_train.py, requeue.py) and the wording in display.py. A Ctrl-C during supervision
ends with EXIT_INTERRUPTED after the cleanup it owes (a local job sharing the terminal is stopped); nothing here
decides what the scheduler does.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from legato.config import Config, load_config
from legato.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError
from legato.orchestrator.control import DETACH_WAIT_S, cancel_run, hand_off
from legato.orchestrator.display import LiveView, status_table
from legato.orchestrator.end_hook import NOTIFY_ENV, run_end_hook
from legato.orchestrator.follow import wait_for_start, watch_script
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.local_train import train_locally, trainer_command
from legato.orchestrator.preflight import checked_config
from legato.orchestrator.requeue import requeue as requeue_job
from legato.orchestrator.rundir import SupervisorLock, capture_config, captured_config, has_started, is_script_run
from legato.orchestrator.runstate import final_manifest
from legato.orchestrator.status import current_job, current_session, read_progress, session_exit_code, summarize
from legato.orchestrator.supervisor import Supervisor, start_session
from legato.repro.redact import Redactor
from legato.session.attempt_lock import held_by, refusal


def cmd_run(args: argparse.Namespace) -> int:
    """`legato run`: start the config's run, or re-attach to the one in progress, and supervise it until it ends (or `--detach`)."""
    checked = checked_config(args.config, args.overrides)
    cfg = checked.cfg
    for key in checked.hidden:
        print(
            f"legato: warning: {key} looks secret; it is redacted in everything legato writes, so the job sees a placeholder. Pass "
            "secrets through the environment.",
            file=sys.stderr,
        )
    lock = SupervisorLock(cfg.run_dir)
    lock.acquire()
    try:
        ledger = Ledger(cfg.run_dir)
        session = current_session(ledger.read())
        code = session_exit_code(session) if session else None
        if code == EXIT_OK:
            print(f"legato: {cfg.run_dir} already completed training; nothing to do.")
            print(status_table(summarize(cfg.run_dir, ledger.read())))
            return code
        # Nothing to re-attach to without a submitted job: a session that ended, or none yet (a script's run was refused by
        # preflight, but one of its launches may hold the directory before it records its first attempt).
        starting = code is not None or current_job(session) is None
        # A launch that no supervisor of this run started (a script's, a stray one) trains there: refuse before recording anything.
        holder = held_by(cfg.run_dir) if starting else None
        if holder is not None:
            raise UsageError(refusal(cfg.run_dir, holder))
        config_path = capture_config(cfg)
        if starting:
            start_session(cfg, ledger, Redactor.from_config(cfg).argv(["legato", *sys.argv[1:]]))
        else:
            print(f"legato: {cfg.run_dir} has a run in progress (job {current_job(session)}); re-attaching to it.")
        if args.detach:
            lock.release()
            return _detach(cfg.run_dir)
        return _supervise(Supervisor(load_config(config_path), config_path, LiveView()))
    finally:
        lock.release()


def cmd_watch(args: argparse.Namespace) -> int:
    """`legato watch`: follow a run's progress; take over its supervision when no other supervisor holds it."""
    run_dir = Path(args.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(
            f"{run_dir} is a file, not a run directory. Pass the run directory a run writes to (run.dir, or the "
            "directory given to the script's Session)."
        )
    if not has_started(run_dir):
        # Right after sbatch, before the first rank wrote anything: wait for it (a script's run has no config to find).
        print(
            f"legato: waiting for a run to start in {run_dir} (nothing has written there yet: a queued job, or a script "
            "not yet at its Session); Ctrl-C to stop",
            flush=True,
        )
        wait_for_start(run_dir, has_started)
    if is_script_run(run_dir):
        return watch_script(run_dir, LiveView(), lambda summary: print(status_table(summary)))
    config_path = captured_config(run_dir)
    cfg = load_config(config_path)
    lock = SupervisorLock(run_dir)
    view = LiveView()
    supervisor = Supervisor(cfg, config_path, view)
    session = supervisor.skip_history()
    view.learn(session)
    print(status_table(summarize(run_dir, session, read_progress(run_dir))))
    code = session_exit_code(session)
    if code is not None:
        return code
    print()
    if lock.held_elsewhere():
        print(f"legato: following {run_dir} (supervised by {lock.holder()})")
        code = supervisor.follow(lock.held_elsewhere)
        if code is not None:
            return _report_end(cfg, code)
        print("legato: the supervisor went away; taking over.")
    lock.acquire()
    try:
        return _supervise(supervisor)
    finally:
        lock.release()


def _supervise(supervisor: Supervisor) -> int:
    cfg = supervisor.cfg
    try:
        code = supervisor.run()
    except KeyboardInterrupt:
        # A second Ctrl-C must not cut the cleanup short (a traceback, and a local job left running): it waits for it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if supervisor.backend.shares_terminal:
            # The local job shares this terminal, so Ctrl-C reached its tasks too: end the run cleanly.
            supervisor.cancel()
            print("\nlegato: interrupted; the local job was stopped. Resume later with the same `legato run`.", file=sys.stderr)
        else:
            print(
                f"\nlegato: detached; the job keeps running. `legato watch {cfg.run_dir}` re-attaches, `legato cancel {cfg.run_dir}` "
                "stops it.",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    code = _report_end(cfg, code)
    _notify_end(cfg.run_dir)
    return code


def _notify_end(run_dir: Path) -> None:
    """Run the user's end command (LEGATO_NOTIFY_COMMAND), once per run's end: only the supervisor that saw it does."""
    summary = summarize(run_dir, Ledger(run_dir).read())
    outcome = run_end_hook(run_dir, summary.state, summary.failure)
    if outcome is None:
        return
    if outcome.code == EXIT_OK:
        print(f"legato: {NOTIFY_ENV} ran (exit 0).")
    else:
        why = outcome.error or f"exited {outcome.code}"
        print(f"legato: warning: {NOTIFY_ENV} {why}; the run's result is unchanged.", file=sys.stderr)


def _report_end(cfg: Config, code: int) -> int:
    summary = summarize(cfg.run_dir, Ledger(cfg.run_dir).read())
    print()
    print(status_table(summary))
    return code


def _detach(run_dir: Path) -> int:
    """Hand the run to a background `legato watch`, wait until it has submitted, and return."""
    handoff = hand_off(run_dir)
    if handoff.job_id is not None:
        print(f"legato: job {handoff.job_id} submitted; supervisor pid {handoff.pid} runs in the background (log: {handoff.log}).")
        print(f"legato: follow it with `legato watch {handoff.run_dir}`, see it with `legato status {handoff.run_dir}`.")
        return EXIT_OK
    if handoff.exit_code is not None:
        print(
            f"legato: the background supervisor exited with code {handoff.exit_code} before submitting; see {handoff.log}.", file=sys.stderr
        )
        return handoff.exit_code or EXIT_FAILED
    print(f"legato: no job submitted within {DETACH_WAIT_S:.0f}s; see {handoff.log}.", file=sys.stderr)
    return EXIT_FAILED


def cmd_cancel(args: argparse.Namespace) -> int:
    """`legato cancel`: cancel a run's job, keeping its checkpoints so that `legato run` continues from them."""
    run_dir = Path(args.run_dir)
    running, job_id = cancel_run(run_dir)
    if not running:
        print(f"legato: {run_dir} is not running; nothing to cancel.")
        return EXIT_OK
    print(f"legato: cancelled job {job_id}; checkpoints in {run_dir} are kept, and `legato run` with the same config continues from them.")
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    """`legato requeue`: a job script's requeue after its launcher, with legato run's guards (legato.orchestrator.requeue)."""
    verdict = requeue_job(Path(args.run_dir), args.exit_code, args.max_requeues)
    print(f"legato requeue: {verdict.message}", file=sys.stderr, flush=True)
    return verdict.exit_code


def cmd_train(args: argparse.Namespace) -> int:
    """`legato train`: train the config on this machine without SLURM, relaunching it after each stop (exit 75) or hang
    (exit 124) as a requeue would."""
    run_dir = load_config(args.config, args.overrides).run_dir
    if args.fresh and final_manifest(run_dir) is not None:
        raise UsageError(f"--fresh: {run_dir} already holds checkpoints. Remove it, or drop --fresh to resume it.")
    return train_locally(trainer_command(args.config, args.nproc, args.overrides), run_dir, _say_attempt)


def _say_attempt(kind: str, d: dict) -> None:
    if kind == "started":
        print(f"legato: attempt {d['attempt']}: {' '.join(d['argv'])}", flush=True)
        return
    if kind == "gave_up":
        print(f"legato: gave up after {d['attempts']} attempts", file=sys.stderr)
        return
    m = d["manifest"]
    where = f"step {m['step']} (global hash {m['global_hash']})" if m else "no checkpoint"
    if kind == "stopped":
        print(f"legato: attempt {d['attempt']} stopped at a committed checkpoint, {where}; resuming", flush=True)
    elif kind == "hung":
        print(f"legato: attempt {d['attempt']} hung and was ended (stacks in the run's hangs/); resuming from {where}", flush=True)
    elif d["code"] == EXIT_OK:
        print(f"legato: training complete after {d['attempt']} attempt(s): {where}", flush=True)
    else:
        print(f"legato: attempt {d['attempt']} failed with exit code {d['code']}; last checkpoint: {where}", file=sys.stderr)
