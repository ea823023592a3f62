"""`legato verify`: prove a config or any command resumes bit for bit, or compare two finished runs.

`cmd_verify` takes the parsed arguments and returns the exit code; the workflows are verify_config.py and
verify_command.py, the comparison verify.py, the verdict's wording reports.py. This module prints each phase as it
starts and keeps the live line on the run that trains.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from legato.events import Kind
from legato.orchestrator.display import LiveView
from legato.orchestrator.preflight import checked_config
from legato.orchestrator.reports import verdict_lines
from legato.orchestrator.verify import Verdict, compare_runs, fresh_directory, interruption_steps, plot_verdict, record_verdict
from legato.orchestrator.verify_command import split_command, verify_command
from legato.orchestrator.verify_config import verify_config
from legato.paths import RunPaths


def cmd_verify(args: argparse.Namespace) -> int:
    """`legato verify`: prove a config (or `--run-command`) resumes bit for bit, or `--compare` two finished runs."""
    if args.reference is not None and (args.compare or args.run_command is not None):
        raise UsageError("--reference goes with a CONFIG: with --compare name both runs, with --command leave it out.")
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
    reuse = Path(args.reference) if args.reference is not None else None
    verdict = verify_config(cfg, steps, out, _verify_phase(args.config, view), view, reuse)
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
        if phase == "reused":
            print(f"legato: 1/2 reference run: reusing {data['dir']}", flush=True)
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
