"""The `legato` command line: the only place that formats for people.

    legato run CONFIG [--set key=value ...] [--detach]   submit, stay attached, carry the run to its end
    legato watch RUN_DIR                                 re-attach (and supervise if no one else does)
    legato status [RUN_DIR] [--json]                     attempts, resumes, how each ended
    legato cancel RUN_DIR                                stop the job and end the run
    legato logs RUN_DIR [--rank R] [--job J]             the tasks' output
    legato verify CONFIG [--interrupt-at 7,19 | --interruptions K --seed S]   prove bitwise resume
    legato verify --command "torchrun ... train.py {run_dir}" --interrupt-at 7,19   the same for any script
    legato plot RUN_DIR                                  loss curve PNG with resume points
    legato repro show|diff|capture                       environment captures per job and attempt
    legato devcluster up|down|status [--nodes N]         a real SLURM on this machine: one node, or N network-namespace nodes
    legato train CONFIG [--nproc N]                      no scheduler: rerun the trainer until done

    legato --version                                     legato <version>

Exit codes: 0 training complete with every resume verified, 1 the run failed
or was cancelled (the reason is in `legato status`), 2 bad input (one
paragraph on stderr naming the flag or key, never the value given; nothing
started or changed), 3 a resume did not verify, 141 stdout's reader went away
(`legato status --json | head -1`): the rest is dropped quietly, and 141 is the
shell's code for a writer ended by SIGPIPE, so `set -o pipefail` sees the cut.

The grammar lives in arguments.py, the workflows in the modules that own them
(verify_config.py, verify_command.py, control.py, local_train.py), the wording
in display.py and reports.py; this module picks the command and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from legato.config import Config, load_config
from legato.config_schema import json_schema
from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from legato.events import JOB_SUBMISSIONS, Kind
from legato.orchestrator import completion, starter
from legato.orchestrator.arguments import MULTINODE_ANY, build_parser
from legato.orchestrator.control import DETACH_WAIT_S, cancel_run, hand_off
from legato.orchestrator.display import LiveView, status_table, waiting_line
from legato.orchestrator.end_hook import NOTIFY_ENV, run_end_hook
from legato.orchestrator.follow import show_events, wait_for_start, watch_script
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.local_train import train_locally, trainer_command
from legato.orchestrator.plot import lost_spans, plot_losses, replay_spans
from legato.orchestrator.preflight import checked_config
from legato.orchestrator.reports import capture_diff_lines, capture_lines, verdict_lines
from legato.orchestrator.repro_diff import diff_captures, resolve_capture
from legato.orchestrator.requeue import requeue as requeue_job
from legato.orchestrator.rundir import SupervisorLock, capture_config, captured_config, has_started, is_script_run, newest_run
from legato.orchestrator.runstate import final_manifest
from legato.orchestrator.status import current_job, current_session, read_progress, summarize
from legato.orchestrator.supervisor import Supervisor, session_exit_code, start_session
from legato.orchestrator.verify import Verdict, compare_runs, fresh_directory, interruption_steps, plot_verdict, record_verdict
from legato.orchestrator.verify_command import split_command, verify_command
from legato.orchestrator.verify_config import verify_config
from legato.orchestrator.waiting import waiting_job
from legato.paths import RunPaths
from legato.repro.capture import CaptureRequest, capture, read_capture
from legato.repro.redact import Redactor, run_key
from legato.session.attempt_lock import held_by, refusal
from legato.slurm import devcluster, multinode
from legato.slurm.devcluster import Settings

EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


# -- run / watch ------------------------------------------------------------


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


# -- status / cancel / logs --------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    """`legato status`: the attempts and state of a run (the newest run when none is named), as a table or `--json`."""
    run_dir = Path(args.run_dir) if args.run_dir else newest_run()
    ledger = Ledger(run_dir)
    if not ledger.exists():
        raise UsageError(f"{run_dir} has no {ledger.path.name}: it is not a run started with `legato run`. Pass the run.dir of such a run.")
    events = ledger.read()
    summary, waiting = summarize(run_dir, events, read_progress(run_dir)), waiting_job(current_session(events), time.time())
    if args.json:
        print(json.dumps({**summary.to_json(), Kind.WAITING.value: waiting}, indent=2))
    else:
        print(status_table(summary) + (f"\n{waiting_line(waiting)}" if waiting else ""))
    return EXIT_OK


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


def cmd_init(args: argparse.Namespace) -> int:
    """`legato init FOLDER`: a ported training script, its job script and a config (legato.orchestrator.starter)."""
    folder = Path(args.folder)
    written = starter.write(folder, starter.Starter(args.name, args.nproc, args.steps, args.time_min))
    print("\n".join(f"legato init: wrote {path}" for path in written))
    print(
        f"Next: cd {folder} && python -m legato.torchrun --nproc-per-node {args.nproc} train.py runs/{args.name}   "
        "(or: sbatch job.sbatch; or: PYTHONPATH=. legato run config.yaml). Replace build() and fit() in train.py with yours."
    )
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    """`legato schema`: the config's JSON Schema on stdout (legato.config_schema)."""
    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """`legato completion SHELL`: the completion script for bash or zsh (legato.orchestrator.completion)."""
    print(completion.script(build_parser(), args.shell), end="")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """`legato logs`: print the task logs of one rank for every job of a run (or `--job`)."""
    run_dir = Path(args.run_dir)
    events = Ledger(run_dir).read()
    jobs = [args.job] if args.job else list(dict.fromkeys(e["job_id"] for e in events if e["event"] in JOB_SUBMISSIONS))
    if not jobs and is_script_run(run_dir):
        print(f"legato: {run_dir} is a script's run: its output went where its launcher sent it. What its Session recorded:")
        return show_events(LiveView(), events)
    if not jobs:
        raise UsageError(f"{run_dir} has no submitted jobs in its ledger. Pass the run.dir of a run started with `legato run`.")
    for job_id in jobs:
        for suffix in ("out", "err"):
            path = RunPaths(run_dir).task_log(str(job_id), args.rank, suffix)
            if path.is_file():
                print(f"==> {path} <==")
                sys.stdout.write(path.read_text(errors="replace"))
    return EXIT_OK


# -- verify / plot ------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    """`legato verify`: prove a config (or `--run-command`) resumes bit for bit, or `--compare` two finished runs."""
    if args.compare:
        reference, run = (Path(p) for p in args.compare)
        for path in (reference, run):
            if not RunPaths(path).trajectories.is_dir():
                raise UsageError(f"{path} has no trajectory/: pass the run directories of two finished runs.")
        compared = compare_runs(reference, run)
        return _report_verdict(compared, args.json, plot_verdict(run / "loss.png", {"reference": reference, "run": run}, compared))
    if args.run_command is not None:
        return _verify_command(args)
    if args.config is None:
        raise UsageError("legato verify needs a CONFIG (or --compare REFERENCE RUN).")
    cfg = checked_config(args.config, args.overrides, executor=args.executor, run_dir_matters=False).cfg
    steps = interruption_steps(cfg.train.steps, _parse_steps(args.interrupt_at), args.interruptions, args.seed)
    out = fresh_directory(args.out, cfg.run.name)
    view = LiveView(events=VERIFY_EVENTS)
    verdict = verify_config(cfg, steps, out, _verify_phase(args.config, view), view)
    if verdict is None:
        return EXIT_USAGE
    return _report_verdict(verdict, args.json, record_verdict(verdict, out))


def _verify_phase(config: str, view: LiveView):
    def say(phase: str, data: dict) -> None:
        if phase == "planned":
            print(
                f"legato: verify {config}: {data['world_size']} ranks, {data['steps']} steps, stop signal to rank "
                f"{data['signal_rank']} after steps {data['at']}"
            )
            return
        print(VERIFY_PHASES[phase], flush=True)
        # The reference's ETA covers the interrupted run's steps too: the whole verification.
        view.begin_run(VERIFY_RUNS[phase], int(phase == "reference"))

    return say


def _verify_command(args: argparse.Namespace) -> int:
    steps = _parse_steps(args.interrupt_at)
    if args.config is not None or not steps:
        raise UsageError(
            'legato verify --command takes no CONFIG and needs --interrupt-at STEPS, e.g. --command "python train.py '
            '{run_dir}" --interrupt-at 7,19.'
        )
    split_command(args.run_command)  # refuse a bad command before anything is created
    out = fresh_directory(args.out, "command")
    out.mkdir(parents=True, exist_ok=True)
    print(f"legato: verify {args.run_command!r}: stop signal to rank {args.signal_rank} after steps {steps}")
    view = LiveView()
    phase = _command_phase(view)
    verdict, why = verify_command(args.run_command, steps, out, args.signal_rank, phase=phase, progress=lambda p: view(Kind.PROGRESS, p))
    if verdict is None:
        print(f"legato: no verdict: {why}")
        return EXIT_FAILED
    return _report_verdict(verdict, args.json, record_verdict(verdict, out))


def _command_phase(view: LiveView):
    def say(phase: str, data: dict) -> None:
        """Each launch of `verify --command` as it starts: the phase, the attempt, and where its output goes."""
        attempt = f", attempt {data['attempt']}" if "attempt" in data else ""
        print(f"{VERIFY_PHASES[phase]}{attempt} (output: {data['log']})", flush=True)
        view.begin_run(VERIFY_RUNS[phase] + attempt, int(phase == "reference"))

    return say


VERIFY_EVENTS = (Kind.ATTEMPT_STARTED, Kind.STOP_SIGNAL, Kind.RESUMED, Kind.FINISHED, Kind.FAILED)
VERIFY_RUNS = {"reference": "reference", "interrupted": "interrupted", "again": "reference again"}
VERIFY_PHASES = {
    "reference": "legato: 1/2 reference run, uninterrupted",
    "interrupted": "legato: 2/2 interrupted run",
    "again": "legato: the runs differ before any resume; running the reference again to test the computation's determinism",
}


def _parse_steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--interrupt-at {text!r} must be comma-separated step numbers, for example 7,19.") from None


def _report_verdict(verdict: Verdict, as_json: bool, png: Path | None) -> int:
    if as_json:
        print(json.dumps({**verdict.to_json(), "plot": str(png) if png else None}, indent=2))
    else:
        print("\n".join(verdict_lines(verdict, png)))
    return EXIT_OK if verdict.identical else EXIT_FAILED


def cmd_plot(args: argparse.Namespace) -> int:
    """`legato plot`: write a run's loss curve (against `--reference` if given), marking its resumes, replays and lost work."""
    run_dir = Path(args.run_dir)
    if not RunPaths(run_dir).trajectories.is_dir():
        raise UsageError(f"{run_dir} has no trajectory/: pass the run directory of a run that trained.")
    events = Ledger(run_dir).read()
    resumed = [e for e in events if e["event"] == Kind.RESUMED]
    runs = {"reference": Path(args.reference)} if args.reference else {}
    runs[run_dir.name] = run_dir
    out = Path(args.out) if args.out else RunPaths(run_dir).loss_plot
    png = plot_losses(out, runs, [e["step"] for e in resumed], replays=replay_spans(resumed), lost=lost_spans(events))
    if png is None:
        raise UsageError("legato plot needs matplotlib: pip install 'legato[plot]'.")
    print(f"legato: wrote {png}")
    return EXIT_OK


# -- repro -------------------------------------------------------------------------


def cmd_repro(args: argparse.Namespace) -> int:
    """`legato repro capture|show|diff`: capture this machine's environment, show a capture, or diff two captures."""
    if args.repro_command == "capture":
        dest = Path(args.dir)
        if (dest / "manifest.json").exists():
            raise UsageError(f"{dest} already holds a capture; pick a new directory so nothing is overwritten.")
        # A capture of its own keeps its own fingerprint key: compare fingerprints only between captures made with one key.
        redactor = Redactor(key=run_key(dest))
        request = CaptureRequest(dest, redactor, args.timeout, argv=tuple(sys.argv), code_paths=tuple(Path(p) for p in args.code or ["."]))
        manifest = capture(request)
        failed = {k: v["error"] for k, v in manifest["commands"].items() if not v["ok"]}
        print(f"legato: captured {len(manifest['sections'])} sections into {dest} in {manifest['capture_seconds']:.2f}s")
        for name, error in failed.items():
            print(f"legato: {name}: {error} (recorded)")
        return EXIT_OK
    if args.repro_command == "show":
        path = resolve_capture(args.capture, args.run)
        manifest, texts = read_capture(path)
        print("\n".join(capture_lines(path, manifest, texts, args.section)))
        return EXIT_OK
    a, b = resolve_capture(args.a, args.run), resolve_capture(args.b, args.run)
    diffs = diff_captures(a, b)
    print("\n".join(capture_diff_lines(a, b, diffs)))
    return EXIT_FAILED if diffs else EXIT_OK


# -- devcluster -------------------------------------------------------------------


def cmd_devcluster(args: argparse.Namespace) -> int:
    """`legato devcluster`: bring the local SLURM cluster (one node, or `--nodes N`) up or down, or report its state."""
    say = lambda text: print(f"devcluster: {text}", flush=True)  # noqa: E731
    if args.nodes is not None:
        return _multinode(args, say)
    if args.action == "down":
        devcluster.down(say)
        return EXIT_OK
    if args.action == "up":
        settings = Settings(args.cred_expire, args.sched_interval, args.kill_wait, not args.no_accounting)
        devcluster.up(settings, say)
    daemons, info = devcluster.status()
    for d in daemons:
        say(f"{d.name:<10} pid {d.pid:<8} {'running' if d.alive() else 'NOT running'}  (log {d.log})")
    say(f"node: {info}" if info else "the controller does not answer")
    return EXIT_OK if info else EXIT_FAILED


def _multinode(args: argparse.Namespace, say) -> int:
    if args.action == "down":
        multinode.down(say)
        return EXIT_OK
    if args.action == "up":
        if args.nodes == MULTINODE_ANY:
            raise UsageError("legato devcluster up --nodes needs a node count, for example --nodes 2.")
        if not args.no_accounting:
            say("the multi-node cluster runs without accounting (no sacct); legato reads job states from scontrol")
        multinode.up(args.nodes, Settings(args.cred_expire, args.sched_interval, args.kill_wait, False), say)
    daemons, info = multinode.status()
    for d in daemons:
        say(f"{d.name:<18} pid {d.pid:<8} {'running' if d.alive() else 'NOT running'}  (log {d.log})")
    if info:
        say(f"SLURM_CONF={multinode.SLURM_CONF}")
        for line in info.splitlines():
            say(f"node: {line}")
    else:
        say("the controller does not answer")
    return EXIT_OK if info else EXIT_FAILED


# -- train (no scheduler) ------------------------------------------------------


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


COMMANDS = {
    "verify": cmd_verify,
    "plot": cmd_plot,
    "repro": cmd_repro,
    "devcluster": cmd_devcluster,
    "run": cmd_run,
    "watch": cmd_watch,
    "status": cmd_status,
    "cancel": cmd_cancel,
    "logs": cmd_logs,
    "train": cmd_train,
    "requeue": cmd_requeue,
    "init": cmd_init,
    "schema": cmd_schema,
    "completion": cmd_completion,
}


def main(argv: list[str] | None = None) -> int:
    """Run one `legato` command; its exit code."""
    try:
        args = build_parser().parse_args(argv)
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:  # any other command: nothing to clean up, no traceback
        print("\nlegato: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the output still buffered for the closed pipe is dropped quietly at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
