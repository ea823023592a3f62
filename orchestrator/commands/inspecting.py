"""The subcommands that read a run: `legato status`, `logs`, `plot` and `repro` (environment captures).

Each `cmd_*` takes the parsed arguments and returns the exit code. They read the run directory only (a `repro
capture` writes a new capture into the folder it is given); the wording lives in display.py and reports.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_OK, UsageError
from legato.events import JOB_SUBMISSIONS, Kind
from legato.orchestrator.display import LiveView, status_table, waiting_line
from legato.orchestrator.follow import show_events
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.plot import lost_spans, plot_losses, replay_spans
from legato.orchestrator.reports import capture_diff_lines, capture_lines
from legato.orchestrator.repro_diff import diff_captures, resolve_capture
from legato.orchestrator.rundir import is_script_run, newest_run
from legato.orchestrator.status import current_session, read_progress, summarize
from legato.orchestrator.waiting import waiting_job
from legato.paths import RunPaths
from legato.repro.capture import CaptureRequest, capture, read_capture
from legato.repro.redact import Redactor, run_key


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
