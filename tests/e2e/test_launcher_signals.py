"""The scheduler's stop signal through `python -m legato.torchrun`, sent from outside by pid as SLURM sends it.

A user's ported nanoGPT loop (examples/port/nanogpt_legato.py) on 2 real ranks under real torchrun; steps are
slowed from outside (LEGATO_CHAOS_STEP_SLEEP_S) so the signal lands mid-run. The signal goes to the launcher
alone (`scancel --signal`, `B:`), to every process of the step (`--signal` without `B:`), to one rank, as TERM
to the launcher (a time limit), to every process before any rank has a Session, and to the launcher before torchrun
has started any rank (a preemption during a slow start: kept, and sent as the ranks appear). Each time the launcher
exits 75 with no rank left behind, and the next launch (its ranks started warm, as torchrun would start them: the
launcher's part is over) resumes verified and ends bit for bit where the uninterrupted run ends. A second launch into
the run directory while the first trains (a job submitted twice) is refused on every rank having written nothing,
and the first goes on unharmed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.cli import ledger, wait_for
from helpers.launches import process_tree, reaped, start_ranks, stderr_tails, steps_done
from helpers.port import UNSEEDED, assert_same_run, torchrun_reference
from helpers.shared_runs import SharedRuns

from legato.runtime.launch import free_port
from legato.system.processes import alive, children

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "examples" / "port" / "nanogpt_legato.py"
STEPS = 25
LAUNCH = (sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2")


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONWARNINGS="ignore", **extra)


def _launch(out: Path, **env: str) -> subprocess.Popen:
    cmd = [*LAUNCH, "--master-port", str(free_port()), str(SCRIPT), str(out)]
    return subprocess.Popen(cmd, env=_env(**env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def reference(shared_runs: SharedRuns) -> Path:
    return torchrun_reference(shared_runs)


TARGETS = {
    "launcher": lambda launcher, ranks: [launcher],
    "every process": lambda launcher, ranks: [launcher, *ranks],
    "one rank": lambda launcher, ranks: ranks[1:2],
}


def _blocks(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has `sig` blocked (its SigBlk mask in /proc): the launcher takes stops from then on."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return bool(mask >> (sig - 1) & 1)


# When the signal comes: mid-run (after three steps), after torchrun started both ranks but before their Sessions
# exist, or before torchrun has started any rank (the launcher is still importing torch).
MID_RUN, BEFORE_THE_SESSION, BEFORE_THE_RANKS = "mid-run", "before-the-session", "before-the-ranks"


@pytest.mark.parametrize(
    ("target", "sig", "when"),
    [
        ("launcher", signal.SIGUSR2, MID_RUN),
        ("every process", signal.SIGUSR2, MID_RUN),
        ("one rank", signal.SIGUSR2, MID_RUN),
        ("launcher", signal.SIGTERM, MID_RUN),
        ("every process", signal.SIGUSR2, BEFORE_THE_SESSION),
        ("launcher", signal.SIGUSR2, BEFORE_THE_RANKS),
    ],
    ids=[
        "usr2-launcher",
        "usr2-every-process",
        "usr2-one-rank",
        "term-launcher",
        "usr2-every-process-before-the-session",
        "usr2-launcher-before-the-ranks",
    ],
)
def test_a_stop_signal_from_outside_ends_in_exit_75_and_an_exact_resume(
    tmp_path: Path, reference: Path, target: str, sig: signal.Signals, when: str
) -> None:
    out = tmp_path / "run"
    launcher = _launch(out, LEGATO_CHAOS_STEP_SLEEP_S="0.3")
    seen: set[int] = {launcher.pid}
    early = when != MID_RUN
    try:
        if when == BEFORE_THE_RANKS:
            wait_for(lambda: _blocks(launcher.pid, sig), 60, "the launcher to take its stop signals")
            assert not children(launcher.pid)
            os.kill(launcher.pid, sig)
        wait_for(lambda: len(children(launcher.pid)) == 2, 120, "torchrun to start both ranks")
        if not early:
            wait_for(lambda: steps_done(out) >= 3, 180, "three trained steps")
        ranks = sorted(children(launcher.pid))
        seen |= set(process_tree(launcher.pid))
        if when != BEFORE_THE_RANKS:
            for pid in TARGETS[target](launcher.pid, ranks):
                os.kill(pid, sig)
        _, stderr = launcher.communicate(timeout=240)
        assert launcher.returncode == 75, stderr[-3000:]
        assert "every rank stopped at a committed checkpoint" in stderr
        assert "Traceback" not in stderr
        if when == BEFORE_THE_RANKS:
            assert "before any rank started" in stderr and "sending them the SIGUSR2 that came before them" in stderr, stderr[-3000:]
        assert not [pid for pid in seen if alive(pid)], "a process of the stopped launch is still alive"
        assert (early or steps_done(out) > 0) and steps_done(out) < STEPS
    finally:
        launcher.kill()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    logs = _resume(out)
    if not early:  # a stop before the first step leaves nothing to resume: the next launch starts from step 0
        assert "resumed at step" in logs and "verified" in logs, logs
    assert_same_run(reference, out, STEPS, UNSEEDED)


def _resume(out: Path) -> str:
    """The next launch, trained to the run's end: its two ranks started warm (the launcher's part, the stop, is over),
    as torchrun starts them. Their stderr."""
    with reaped(start_ranks(SCRIPT, out)) as ranks:
        assert [r.wait(timeout=300) for r in ranks] == [0, 0], stderr_tails(out)
    return stderr_tails(out)


def test_a_sigkilled_launcher_takes_its_ranks_with_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = _launch(out, LEGATO_CHAOS_STEP_SLEEP_S="0.3")
    seen: set[int] = {launcher.pid}
    try:
        wait_for(lambda: steps_done(out) >= 2, 180, "two trained steps")
        seen |= set(process_tree(launcher.pid))
        assert len(seen) >= 3
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=60)
        wait_for(lambda: not [pid for pid in seen if alive(pid)], 60, "the ranks to die with their launcher")
    finally:
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_second_launch_into_a_training_run_is_refused_and_harms_nothing(tmp_path: Path, reference: Path) -> None:
    """A job submitted twice: the second launch waits for the run directory's lock, then every one of its ranks is
    refused (exit 2, naming the first launch's rank 0) having recorded nothing; the first, stopped from outside, is
    resumed by a third launch and the run ends bit for bit where the uninterrupted run ends."""
    out = tmp_path / "run"
    first = _launch(out, LEGATO_CHAOS_STEP_SLEEP_S="3")  # slow enough to outlast the second launch's start and wait
    seen: set[int] = {first.pid}
    try:
        wait_for(lambda: steps_done(out) >= 2, 180, "two trained steps")
        seen |= set(process_tree(first.pid))
        holder = json.loads((out / "attempt.lock").read_text())
        assert holder["pid"] in seen
        second = subprocess.run(
            [*LAUNCH, "--master-port", str(free_port()), str(SCRIPT), str(out)], env=_env(), capture_output=True, text=True, timeout=300
        )
        assert first.poll() is None, "the first launch ended before the second was refused: the test proves nothing"
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"Another launch is training in {out} (pid {holder['pid']} on " in second.stderr, second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        os.kill(first.pid, signal.SIGUSR2)
        _, stderr = first.communicate(timeout=240)
        assert first.returncode == 75, stderr[-3000:]
    finally:
        first.kill()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert [e["event"] for e in ledger(out)].count("attempt_started") == 1, "the refused launch recorded an attempt"
    logs = _resume(out)
    assert "resumed at step" in logs and "verified" in logs, logs
    assert_same_run(reference, out, STEPS, UNSEEDED)
