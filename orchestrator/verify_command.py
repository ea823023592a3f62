"""`legato verify --command "..."`: prove any user script bitwise, whatever launches it (torchrun, srun, a shell).

The command is split with shlex and run without a shell; every `{run_dir}` in
it becomes the run directory of one run. The reference run goes once,
uninterrupted. The interrupted run gets the stop planted through
LEGATO_CHAOS_SIGNAL_AT (the script's Session sends the signal to itself after
those steps) and is relaunched after every exit 75 (`python -m
legato.torchrun` turns torchrun's stop into 75). The two run directories are
compared through what the Session wrote (trajectories, checkpoints) by
`legato.orchestrator.verify.compare_runs`, the resumes and their verdicts
among them from the interrupted run's ledger (rank 0's Session records them
there, `legato.recorder`). When the two differ, a second uninterrupted run
tells the cases apart: training bitwise identical while the script's unseeded
global RNGs (python's, numpy's: different in any two of its processes, never
drawn in training) differ, which is compared without them and named; a
computation that is not reproducible; or a resume that went wrong. A step
outside the run, or an interrupted run that never stopped, is refused (exit 2):
a verification with no resume proves nothing. Each
launch's output goes to a log file inside the verify directory; nothing is
written anywhere else.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from legato.errors import EXIT_OK, EXIT_STOPPED, UsageError
from legato.orchestrator.status import read_progress
from legato.orchestrator.verify import Phase, Verdict, compare_runs, diagnose, final_step, nondeterminism, unseeded_rngs
from legato.paths import RunPaths
from legato.session.policy import HASH_ENV

PLACEHOLDER = "{run_dir}"
CHAOS_VARS = ("LEGATO_CHAOS_SIGNAL_AT", "LEGATO_CHAOS_SIGNAL_RANK")
PROGRESS_EVERY_S = 1.0  # how often a launch's progress file is read while it runs
Progress = Callable[[dict], None]
# How a script (not a config) makes its computation reproducible.
SCRIPT_REMEDY = 'legato.seed_everything(seed, rank, mode="strict") before building the model'


def split_command(text: str) -> list[str]:
    """The command's argv; a UsageError when it is empty, unparsable, or never names `{run_dir}`."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--command {text[:80]!r} cannot be split into arguments ({exc}). Quote it as you would in a shell.") from None
    if not argv or not any(PLACEHOLDER in arg for arg in argv):
        raise UsageError(
            f"--command {text[:80]!r} does not name {PLACEHOLDER}. Write {PLACEHOLDER} where the script takes its run "
            'directory, e.g. --command "python -m legato.torchrun --nproc-per-node 2 train.py {run_dir}".'
        )
    return argv


def launch(
    argv: list[str], run_dir: Path, log: Path, env: dict[str, str], timeout_s: float, progress: Progress = lambda reading: None
) -> int:
    """Run `argv` once with the run directory in place of its placeholder, its output to `log`; the exit code.
    `progress` hears each new reading of the run's progress file while it runs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Every step's state hash in the trajectories, so that a divergence is named at its first step and component.
    env = {**env, HASH_ENV: "1"}
    deadline, seen, started = time.monotonic() + timeout_s, None, time.time()
    with log.open("w") as out:
        proc = subprocess.Popen([a.replace(PLACEHOLDER, str(run_dir)) for a in argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    return proc.wait(timeout=min(PROGRESS_EVERY_S, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise
                reading = read_progress(run_dir) if _written_since(run_dir, started) else None  # not an earlier launch's
                if reading is not None and reading != seen:
                    seen = reading
                    progress(reading)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _written_since(run_dir: Path, started: float) -> bool:
    try:
        return RunPaths(run_dir).progress.stat().st_mtime >= started
    except OSError:
        return False


def run_interrupted(
    argv: list[str], out: Path, steps: list[int], signal_rank: int, timeout_s: float, phase: Phase, progress: Progress
) -> int:
    """Launch until an exit other than 75; the last exit code."""
    env = dict(os.environ, LEGATO_CHAOS_SIGNAL_AT=",".join(str(s) for s in steps), LEGATO_CHAOS_SIGNAL_RANK=str(signal_rank))
    code = EXIT_STOPPED
    for attempt in range(1, len(steps) + 3):
        log = out / f"interrupted.attempt{attempt}.log"
        phase("interrupted", {"attempt": attempt, "log": str(log)})
        code = launch(argv, out / "interrupted", log, env, timeout_s, progress)
        if code != EXIT_STOPPED:
            break
    return code


def verify_command(
    text: str,
    steps: list[int],
    out: Path,
    signal_rank: int = 0,
    timeout_s: float = 3600,
    phase: Phase = lambda name, data: None,
    progress: Progress = lambda reading: None,
) -> tuple[Verdict | None, str]:
    """The verdict for `text` interrupted after `steps`, or None and why no comparison was possible; `phase` hears each launch
    as it starts: "reference", "interrupted" (its attempt) and "again", each with its log's path; `progress` each new
    reading of the running launch's progress file."""
    argv = split_command(text)
    clean = {k: v for k, v in os.environ.items() if k not in CHAOS_VARS}
    phase("reference", {"log": str(out / "reference.log")})
    code = launch(argv, out / "reference", out / "reference.log", clean, timeout_s, progress)
    if code != EXIT_OK:
        return None, f"the reference run exited {code} (see {out / 'reference.log'}); the command must train to its end first"
    refuse_outside(steps, final_step(out / "reference"))
    code = run_interrupted(argv, out, steps, signal_rank, timeout_s, phase, progress)
    verdict = compare_runs(out / "reference", out / "interrupted")
    if code == EXIT_OK and not verdict.resumes:
        raise UsageError(
            f"The interrupted run finished without a single stop: no interruption after steps {steps} happened, so nothing was "
            f"proven (see the interrupted.attempt*.log files in {out}). The script's Session plants the stop itself "
            "(LEGATO_CHAOS_SIGNAL_AT): make sure the command runs a legato.Session that reaches those steps, and pick steps "
            "well before its end."
        )
    if code != EXIT_OK:
        verdict.identical = False
        verdict.cause = f"the interrupted run's last launch exited {code} (see the interrupted.attempt*.log files in {out})"
        return verdict, ""
    if verdict.divergence is not None:
        # A script's state may differ between any two of its processes (an unseeded RNG): a second
        # uninterrupted run tells that apart from a resume that went wrong.
        again = out / "again"
        phase("again", {"log": str(out / "again.log")})
        launch(argv, again, out / "again.log", clean, timeout_s, progress)
        verdict = _judge_against_again(verdict, out / "reference", out / "interrupted", again)
    return verdict, ""


def refuse_outside(steps: list[int], total: int) -> None:
    """A UsageError when a step to interrupt after is not inside the run (1 to total - 1): it could never be proven."""
    outside = [s for s in steps if not 1 <= s < total]
    if outside:
        raise UsageError(
            f"--interrupt-at {','.join(map(str, outside))}: the command trains {total} steps (its uninterrupted run just did), so "
            f"a stop there never happens and would prove nothing. Pick steps from 1 to {total - 1}."
        )


def _judge_against_again(verdict: Verdict, reference: Path, interrupted: Path, again: Path) -> Verdict:
    """The verdict once a second uninterrupted run is known: training identical but for the script's unseeded global RNGs,
    a non-reproducible computation, or a divergence that resuming caused."""
    unseeded = unseeded_rngs(reference, again, verdict.world_size)
    if unseeded is None:
        verdict.cause = nondeterminism(reference, again, verdict.world_size, SCRIPT_REMEDY) or diagnose(verdict, True)
        return verdict
    if unseeded:
        # Two plain runs differ in these RNGs alone: compare everything else, each loss bit and every other component.
        return compare_runs(reference, interrupted, unseeded)
    verdict.cause = diagnose(verdict, True)
    return verdict
