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

Exit codes: 0 training complete with every resume verified, 1 the run failed
or was cancelled (the reason is in `legato status`), 2 bad input (one
paragraph on stderr, nothing started or changed), 3 a resume did not verify.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from legato.config import Config, load_config
from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UsageError
from legato.events import JOB_SUBMISSIONS, Kind
from legato.orchestrator.display import LiveView, status_table
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.plot import plot_losses
from legato.orchestrator.redact import Redactor, run_key
from legato.orchestrator.repro import CaptureRequest, capture, read_capture
from legato.orchestrator.repro_diff import diff_captures, resolve_capture
from legato.orchestrator.rundir import SupervisorLock, capture_config, captured_config, check_compatible, redact_config
from legato.orchestrator.runstate import final_manifest
from legato.orchestrator.status import current_job, current_session, read_progress, summarize
from legato.orchestrator.supervisor import Supervisor, session_exit_code, start_session
from legato.orchestrator.verify import Verdict, compare_runs, interruption_steps, nondeterminism, plan_runs
from legato.orchestrator.verify_command import split_command, verify_command
from legato.paths import RunPaths
from legato.slurm import devcluster, multinode
from legato.slurm.devcluster import Settings
from legato.slurm.jobs import JobHandle

MAX_LOCAL_ATTEMPTS = 100
DETACH_WAIT_S = 120.0
EXIT_INTERRUPTED = 130
MULTINODE_ANY = -1  # `--nodes` without a number: whichever multi-node cluster is up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="legato", description="Exact-resume supervisor for PyTorch DDP jobs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="submit a config and carry it across every stop until training completes")
    run.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key (YAML typing)")
    run.add_argument("--detach", action="store_true", help="return once the job is submitted; `legato watch RUN_DIR` re-attaches")

    watch = sub.add_parser("watch", help="follow a run (and supervise it when no supervisor is attached)")
    watch.add_argument("run_dir")

    status = sub.add_parser("status", help="attempts, resumes and the state of a run")
    status.add_argument("run_dir", nargs="?", help="run directory (default: the newest under runs/)")
    status.add_argument("--json", action="store_true", help="print the same as JSON")

    cancel = sub.add_parser("cancel", help="cancel the run's job and end the run")
    cancel.add_argument("run_dir")

    logs = sub.add_parser("logs", help="print the output of the run's tasks")
    logs.add_argument("run_dir")
    logs.add_argument("--rank", type=int, default=0, help="task rank (default 0)")
    logs.add_argument("--job", default=None, help="job id (default: every job of the run)")

    verify = sub.add_parser("verify", help="prove that a config resumes bit for bit against an uninterrupted run")
    verify.add_argument("config", nargs="?", help="YAML config (omit with --compare)")
    where = verify.add_mutually_exclusive_group()
    where.add_argument("--interrupt-at", metavar="STEPS", help="comma-separated steps after which one rank gets the stop signal, e.g. 7,19")
    where.add_argument("--interruptions", type=int, metavar="K", help="K interruptions at random steps (with --seed)")
    where.add_argument("--compare", nargs=2, metavar=("REFERENCE", "RUN"), help="only compare two finished run directories")
    verify.add_argument("--seed", type=int, default=0, help="seed for the random interruption steps (default 0)")
    verify.add_argument("--executor", choices=("local", "slurm"), help="override the config's executor")
    verify.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    verify.add_argument("--out", metavar="DIR", help="where the runs go (default runs/verify/<name>-<time>)")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.add_argument("--command", dest="run_command", metavar="CMD", help="verify this command instead of a config; {run_dir} stands for its run directory")
    verify.add_argument("--signal-rank", type=int, default=0, help="with --command: the rank that gets the stop signal (default 0)")

    plot = sub.add_parser("plot", help="PNG of a run's loss curve with its resume points")
    plot.add_argument("run_dir")
    plot.add_argument("--reference", metavar="RUN_DIR", help="overlay this run (e.g. an uninterrupted one)")
    plot.add_argument("--out", metavar="PNG", help="default RUN_DIR/loss.png")

    repro = sub.add_parser("repro", help="environment captures: show one, diff two, capture now")
    rsub = repro.add_subparsers(dest="repro_command", required=True)
    show = rsub.add_parser("show", help="print a capture")
    show.add_argument("capture", help="a capture directory, or JOB[/ATTEMPT] with --run")
    show.add_argument("--run", metavar="RUN_DIR", help="run directory to look JOB[/ATTEMPT] up in")
    show.add_argument("--section", action="append", default=[], help="only these sections (env, packages, git, stack, ...)")
    rdiff = rsub.add_parser("diff", help="what differs between two captures; exit 1 when anything does")
    rdiff.add_argument("a", help="a capture directory, or JOB[/ATTEMPT] with --run")
    rdiff.add_argument("b")
    rdiff.add_argument("--run", metavar="RUN_DIR", help="run directory to look JOB[/ATTEMPT] up in")
    rcap = rsub.add_parser("capture", help="capture the current environment into DIR (for any script)")
    rcap.add_argument("dir")
    rcap.add_argument("--code", action="append", default=[], metavar="PATH", help="your code's directory, for its git state (default: .)")
    rcap.add_argument("--timeout", type=float, default=5.0, metavar="S", help="limit per external command (default %(default)s)")

    dev = sub.add_parser("devcluster", help="a real SLURM cluster on this machine: one node, or N nodes in network namespaces (root, Debian)")
    dev.add_argument("action", choices=("up", "down", "status"))
    dev.add_argument(
        "--nodes", type=int, nargs="?", const=MULTINODE_ANY, default=None, metavar="N",
        help="the multi-node cluster: N slurmd nodes, each its own network namespace, hostname and munge (with down/status: N may be omitted)",
    )
    dev.add_argument("--cred-expire", type=int, default=Settings.cred_expire_s, metavar="S", help="credential expiry; a requeued job waits S+1 s (default %(default)s)")
    dev.add_argument("--sched-interval", type=int, default=Settings.sched_interval_s, metavar="S", help="scheduler and backfill interval (default %(default)s)")
    dev.add_argument("--kill-wait", type=int, default=Settings.kill_wait_s, metavar="S", help="SIGTERM to SIGKILL delay (default %(default)s)")
    dev.add_argument("--no-accounting", action="store_true", help="no slurmdbd/MariaDB: sacct will not work")

    train = sub.add_parser("train", help="run the trainer locally without a scheduler, resuming after every stop until done")
    train.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    train.add_argument("--nproc", type=int, default=None, help="ranks (default: local.tasks)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--fresh", action="store_true", help="refuse to start if the run directory already has checkpoints")
    return parser


# -- run / watch ------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    cfg, hidden = redact_config(load_config(args.config, args.overrides))
    for key in hidden:
        print(f"legato: warning: {key} looks secret; it is redacted in everything legato writes, so the job sees a placeholder. Pass secrets through the environment.", file=sys.stderr)
    _check_entrypoint(cfg)
    check_compatible(cfg)
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
        config_path = capture_config(cfg)
        if code is not None or not session:
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
    run_dir = Path(args.run_dir)
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
        if cfg.executor == "local":
            # The local job shares this terminal, so Ctrl-C reached its tasks too: end the run cleanly.
            supervisor.cancel()
            print("\nlegato: interrupted; the local job was stopped. Resume later with the same `legato run`.", file=sys.stderr)
        else:
            print(f"\nlegato: detached; the job keeps running. `legato watch {cfg.run_dir}` re-attaches, `legato cancel {cfg.run_dir}` stops it.", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report_end(cfg, code)


def _report_end(cfg: Config, code: int) -> int:
    summary = summarize(cfg.run_dir, Ledger(cfg.run_dir).read())
    print()
    print(status_table(summary))
    return code


def _detach(run_dir: Path) -> int:
    """Hand the run to a background `legato watch`, wait until it has submitted, and return."""
    run_dir = run_dir.resolve()
    log_path = RunPaths(run_dir).supervisor_log
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", "legato.orchestrator.cli", "watch", str(run_dir)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    ledger = Ledger(run_dir)
    deadline = time.monotonic() + DETACH_WAIT_S
    while time.monotonic() < deadline:
        job_id = current_job(current_session(ledger.read()))
        if job_id is not None:
            print(f"legato: job {job_id} submitted; supervisor pid {child.pid} runs in the background (log: {log_path}).")
            print(f"legato: follow it with `legato watch {run_dir}`, see it with `legato status {run_dir}`.")
            return EXIT_OK
        if child.poll() is not None:
            print(f"legato: the background supervisor exited with code {child.returncode} before submitting; see {log_path}.", file=sys.stderr)
            return child.returncode or EXIT_FAILED
        time.sleep(0.2)
    print(f"legato: no job submitted within {DETACH_WAIT_S:.0f}s; see {log_path}.", file=sys.stderr)
    return EXIT_FAILED


def _check_entrypoint(cfg: Config) -> None:
    """Import the user's entrypoint here, so a missing module or a wrong signature is refused before anything is submitted."""
    if cfg.train.entrypoint is None:
        return
    from legato.runtime.job import resolve_entrypoint

    resolve_entrypoint(cfg)


# -- status / cancel / logs --------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir) if args.run_dir else _newest_run()
    ledger = Ledger(run_dir)
    if not ledger.exists():
        raise UsageError(f"{run_dir} has no {ledger.path.name}: it is not a run started with `legato run`. Pass the run.dir of such a run.")
    summary = summarize(run_dir, ledger.read(), read_progress(run_dir))
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print(status_table(summary))
    return EXIT_OK


def _newest_run() -> Path:
    ledgers = sorted((p for p in Path("runs").glob("*/") if RunPaths(p).ledger.is_file()), key=lambda p: RunPaths(p).ledger.stat().st_mtime)
    if not ledgers:
        raise UsageError("No run directory given and none under ./runs has a ledger. Pass the run.dir of a run started with `legato run`.")
    return ledgers[-1]


def cmd_cancel(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    cfg = load_config(captured_config(run_dir))
    ledger = Ledger(run_dir)
    session = current_session(ledger.read())
    if session_exit_code(session) is not None:
        print(f"legato: {run_dir} is not running; nothing to cancel.")
        return EXIT_OK
    job_id = current_job(session)
    ledger.append(Kind.CANCEL_REQUESTED, job_id=job_id)
    if job_id is not None:
        JobHandle(cfg.executor, job_id).cancel()
    if not SupervisorLock(run_dir).held_elsewhere():
        ledger.append(Kind.CANCELLED, job_id=job_id, reason="cancelled by the user")
    print(f"legato: cancelled job {job_id}; checkpoints in {run_dir} are kept, and `legato run` with the same config continues from them.")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    events = Ledger(run_dir).read()
    jobs = [args.job] if args.job else list(dict.fromkeys(e["job_id"] for e in events if e["event"] in JOB_SUBMISSIONS))
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
    if args.compare:
        reference, run = (Path(p) for p in args.compare)
        for path in (reference, run):
            if not RunPaths(path).trajectories.is_dir():
                raise UsageError(f"{path} has no trajectory/: pass the run directories of two finished runs.")
        verdict = compare_runs(reference, run)
        png = plot_losses(run / "loss.png", {"reference": reference, "run": run}, _resume_steps(verdict), _div_step(verdict), _replays(verdict.resumes))
        return _report_verdict(verdict, args.json, png)
    if args.run_command is not None:
        return _verify_command(args)
    if args.config is None:
        raise UsageError("legato verify needs a CONFIG (or --compare REFERENCE RUN).")
    cfg, _ = redact_config(load_config(args.config, args.overrides))
    if args.executor:
        cfg.executor = args.executor
    _check_entrypoint(cfg)
    at = _parse_steps(args.interrupt_at)
    steps = interruption_steps(cfg.train.steps, at, args.interruptions, args.seed)
    out = Path(args.out or f"runs/verify/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} is not empty; give --out a new directory so no earlier result is overwritten.")
    reference_cfg, run_cfg = plan_runs(cfg, out, steps)
    print(f"legato: verify {args.config}: {cfg.world_size} ranks, {cfg.train.steps} steps, stop signal to rank {run_cfg.chaos.signal_rank} after steps {steps}")
    print("legato: 1/2 reference run, uninterrupted")
    code = _run_to_end(reference_cfg)
    if code == EXIT_USAGE:
        return code
    print("legato: 2/2 interrupted run")
    _run_to_end(run_cfg)
    verdict = compare_runs(reference_cfg.run_dir, run_cfg.run_dir)
    if verdict.diverged_before_resuming:
        print("legato: the runs differ before any resume; running the reference again to test the computation's determinism")
        again = plan_runs(cfg, out / "again", steps)[0]
        _run_to_end(again)
        verdict.cause = nondeterminism(reference_cfg.run_dir, again.run_dir, verdict.world_size) or verdict.cause
    runs = {"reference": reference_cfg.run_dir, "interrupted": run_cfg.run_dir}
    png = plot_losses(out / "loss.png", runs, _resume_steps(verdict), _div_step(verdict), _replays(verdict.resumes))
    (out / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
    return _report_verdict(verdict, args.json, png)


def _verify_command(args: argparse.Namespace) -> int:
    steps = _parse_steps(args.interrupt_at)
    if args.config is not None or not steps:
        raise UsageError('legato verify --command takes no CONFIG and needs --interrupt-at STEPS, e.g. --command "python train.py {run_dir}" --interrupt-at 7,19.')
    split_command(args.run_command)  # refuse a bad command before anything is created
    out = Path(args.out or f"runs/verify/command-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} is not empty; give --out a new directory so no earlier result is overwritten.")
    out.mkdir(parents=True, exist_ok=True)
    print(f"legato: verify {args.run_command!r}: stop signal to rank {args.signal_rank} after steps {steps}")
    verdict, why = verify_command(args.run_command, steps, out, args.signal_rank)
    if verdict is None:
        print(f"legato: no verdict: {why}")
        return EXIT_FAILED
    runs = {"reference": out / "reference", "interrupted": out / "interrupted"}
    png = plot_losses(out / "loss.png", runs, _resume_steps(verdict), _div_step(verdict), _replays(verdict.resumes))
    (out / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
    return _report_verdict(verdict, args.json, png)


VERIFY_EVENTS = (Kind.ATTEMPT_STARTED, Kind.STOP_SIGNAL, Kind.RESUMED, Kind.FINISHED, Kind.FAILED)


def _parse_steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--interrupt-at {text!r} must be comma-separated step numbers, for example 7,19.") from None


def _run_to_end(cfg: Config) -> int:
    lock = SupervisorLock(cfg.run_dir)
    lock.acquire()
    try:
        config_path = capture_config(cfg)
        start_session(cfg, Ledger(cfg.run_dir), ["legato", "verify"])
        return Supervisor(cfg, config_path, LiveView(events=VERIFY_EVENTS)).run()
    finally:
        lock.release()


def _replays(resumes: list[dict]) -> list[tuple[int, int]]:
    """(base step, resumed step) of every resume that replayed."""
    return [(r["replay"]["from_step"], r["step"]) for r in resumes if r.get("replay")]


def _resume_steps(verdict: Verdict) -> list[int]:
    return [r["step"] for r in verdict.resumes]


def _div_step(verdict: Verdict) -> int | None:
    return verdict.divergence.step if verdict.divergence else None


def _report_verdict(verdict: Verdict, as_json: bool, png: Path | None) -> int:
    if as_json:
        print(json.dumps({**verdict.to_json(), "plot": str(png) if png else None}, indent=2))
        return EXIT_OK if verdict.identical else EXIT_FAILED
    if verdict.identical:
        replayed = sum(1 for r in verdict.resumes if (r.get("replay") or {}).get("identical"))
        print(f"legato: bitwise identical: {verdict.steps} steps, {len(verdict.resumes)} resumes ({replayed} replay-verified), "
              f"{verdict.checkpoints_compared} checkpoints compared, final hash {verdict.run_final_hash}")
    else:
        d = verdict.divergence
        if d is not None:
            loss = f"; loss {d.reference_loss} vs {d.run_loss}" if d.loss_differs else ""
            print(f"legato: DIVERGED at step {d.step}, rank {d.rank}: {', '.join(d.components) or 'loss only'} differ{loss}")
        else:
            print(f"legato: NOT identical: final hash {verdict.reference_final_hash} vs {verdict.run_final_hash}")
        print(f"legato: likely cause: {verdict.cause}")
    print(f"legato: plot: {png}" if png else "legato: no plot: install matplotlib (pip install 'legato[plot]') for the PNG")
    return EXIT_OK if verdict.identical else EXIT_FAILED


def cmd_plot(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not RunPaths(run_dir).trajectories.is_dir():
        raise UsageError(f"{run_dir} has no trajectory/: pass the run directory of a run that trained.")
    resumed = [e for e in Ledger(run_dir).read() if e["event"] == Kind.RESUMED]
    runs = {"reference": Path(args.reference)} if args.reference else {}
    runs[run_dir.name] = run_dir
    png = plot_losses(Path(args.out) if args.out else RunPaths(run_dir).loss_plot, runs, [e["step"] for e in resumed], replays=_replays(resumed))
    if png is None:
        raise UsageError("legato plot needs matplotlib: pip install 'legato[plot]'.")
    print(f"legato: wrote {png}")
    return EXIT_OK


# -- repro -------------------------------------------------------------------------


def cmd_repro(args: argparse.Namespace) -> int:
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
        labels = ", ".join(f"{k} {v}" for k, v in manifest["labels"].items())
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest["time"]))
        print(f"capture {path}: {labels or 'unsupervised'}; host {manifest['host']}; {when}; took {manifest['capture_seconds']:.2f}s")
        for name, cmd in manifest["commands"].items():
            print(f"  {name}: {'ok' if cmd['ok'] else 'FAILED: ' + cmd['error']} ({cmd['seconds']:.2f}s)")
        for name, text in texts.items():
            if not args.section or name in args.section:
                print(f"\n== {name} ==\n{text.rstrip()}")
        return EXIT_OK
    a, b = resolve_capture(args.a, args.run), resolve_capture(args.b, args.run)
    diffs = diff_captures(a, b)
    if not diffs:
        print(f"legato: no difference between {a} and {b}")
        return EXIT_OK
    print(f"legato: {a} -> {b}: {len(diffs)} section(s) differ")
    for d in diffs:
        print(f"\n== {d.section} ==")
        for line in d.lines:
            print(f"  {line}")
    return EXIT_FAILED


# -- devcluster -------------------------------------------------------------------


def cmd_devcluster(args: argparse.Namespace) -> int:
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
    cfg = load_config(args.config, args.overrides)
    run_dir = cfg.run_dir
    if args.fresh and final_manifest(run_dir) is not None:
        raise UsageError(f"--fresh: {run_dir} already holds checkpoints. Remove it, or drop --fresh to resume it.")
    cmd = [sys.executable, "-m", "legato", str(args.config)]
    if args.nproc is not None:
        cmd += ["--nproc", str(args.nproc)]
    for item in args.overrides:
        cmd += ["--set", item]
    for attempt in range(1, MAX_LOCAL_ATTEMPTS + 1):
        print(f"legato: attempt {attempt}: {' '.join(cmd[1:])}", flush=True)
        code = subprocess.call(cmd)
        manifest = final_manifest(run_dir)
        where = f"step {manifest['step']} (global hash {manifest['global_hash']})" if manifest else "no checkpoint"
        if code == EXIT_STOPPED:
            print(f"legato: attempt {attempt} stopped at a committed checkpoint, {where}; resuming", flush=True)
            continue
        if code == EXIT_OK:
            print(f"legato: training complete after {attempt} attempt(s): {where}", flush=True)
        else:
            print(f"legato: attempt {attempt} failed with exit code {code}; last checkpoint: {where}", file=sys.stderr)
        return code
    print(f"legato: gave up after {MAX_LOCAL_ATTEMPTS} attempts", file=sys.stderr)
    return EXIT_FAILED


COMMANDS = {"verify": cmd_verify, "plot": cmd_plot, "repro": cmd_repro, "devcluster": cmd_devcluster, "run": cmd_run, "watch": cmd_watch, "status": cmd_status, "cancel": cmd_cancel, "logs": cmd_logs, "train": cmd_train}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
