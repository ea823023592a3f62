"""Dashboards intact, the epoch body cut by a stop, and a script's run seen by `legato status/logs/plot/watch`.

A DDP-tutorial-style user script (tests/helpers/tracker_loop.py: own DataLoader and DistributedSampler,
AdamW, a per-epoch cosine schedule, per-epoch validation, TensorBoard on rank 0) on 2 real ranks under
`python -m legato.torchrun`, stopped from outside by pid (USR2 to the launcher, as `scancel --signal` sends
it) twice mid-epoch and SIGKILLed (every process, as a node failure ends it) after a periodic checkpoint,
then relaunched to its end. The real TensorBoard event files are read back with `tensorboard`'s
EventAccumulator: one training point per step with the step's exact loss, a monotonic step axis, and
validation points only at the real epoch ends. Each planted fault in the script (logging replayed steps,
no purge_step, validation after a stop) is caught by the same checker; there the checker is the subject, not the
launcher, so the 2 ranks start as srun would start them (RANK, WORLD_SIZE set; warm, tests/helpers/warm.py) and the
stop goes to one rank by pid.

The script logs through `session.tracker`, to TensorBoard and to W&B offline at once. Each attempt's offline
`.wandb` file is read back with W&B's own record definitions (tests/helpers/wandb_files.py): every attempt that
ended in order holds each of its steps once with the step's exact loss; the SIGKILLed one holds what W&B had
written before the kill (a first part of its steps, often none: W&B writes every 15 s), and nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, trajectory
from helpers.cli import legato, wait_for
from helpers.launches import process_tree, reaped, start_ranks, stderr_tails, steps_done
from helpers.wandb_files import history, offline_runs

from legato.runtime.launch import free_port
from legato.system.processes import alive

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "tests" / "helpers" / "tracker_loop.py"
LAUNCH = (sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2")
STEPS_PER_EPOCH, EPOCHS = 24, 4
STEPS = STEPS_PER_EPOCH * EPOCHS
# Each interruption: ("stop", after at least this many steps) or ("kill", once this periodic checkpoint is published).
MAIN = (("stop", 8), ("stop", 30), ("kill", 60))


def tb_points(log_dir: Path, purged: bool = True) -> dict[str, list[tuple[int, float]]]:
    """Every scalar point TensorBoard shows, per tag, in the order it shows them (after its purges); with
    `purged=False`, every point the event files hold, what each attempt logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}, purge_orphaned_data=purged)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def dashboard_problems(run: Path) -> list[str]:
    """What is wrong with the dashboard: a step logged twice or never, steps out of order, a training point that is not
    the step's real loss (rank 0's trajectory), a validation point where no epoch ended; and a validation that ran
    after a stop, in any attempt (its point may be purged from the dashboard, but it was logged)."""
    problems = []
    points = tb_points(run / "tb")
    train = [step for step, _ in points.get("train/loss", [])]
    twice = sorted(step for step, n in Counter(train).items() if n > 1)
    if twice:
        problems.append(f"train/loss logged more than once at steps {twice}")
    if sorted(set(train)) != list(range(STEPS)):
        problems.append(f"train/loss misses steps {sorted(set(range(STEPS)) - set(train))}")
    if train != sorted(train):
        problems.append("train/loss's step axis is not monotonic")
    losses = {r["step"] - 1: float.fromhex(r["loss_hex"]) for r in trajectory(run, 0)}
    wrong = sorted({step for step, value in points.get("train/loss", []) if value != losses.get(step)})
    if wrong:
        problems.append(f"train/loss is not the step's loss at steps {wrong}")
    val = [step for step, _ in points.get("val/loss", [])]
    if val != [STEPS_PER_EPOCH * (e + 1) for e in range(EPOCHS)]:
        problems.append(f"val/loss at steps {val}, not once at each epoch's end")
    logged = sorted({step for step, _ in tb_points(run / "tb", purged=False).get("val/loss", []) if step % STEPS_PER_EPOCH})
    if logged:
        problems.append(f"validation ran after a stop, at steps {logged}")
    return problems


def wandb_problems(run: Path, starts: list[int], killed: int) -> list[str]:
    """What is wrong with the W&B offline files of attempts that resumed at `starts` (the `killed`-th SIGKILLed): a
    step twice in a file, a training point that is not the step's loss, an orderly attempt missing a step, a killed
    one holding anything but a first part of its steps."""
    losses = {r["step"] - 1: float.fromhex(r["loss_hex"]) for r in trajectory(run, 0)}
    files = offline_runs(run)
    if len(files) != len(starts):
        return [f"{len(files)} offline W&B runs, not one per attempt ({len(starts)})"]
    problems = []
    for n, (path, start, end) in enumerate(zip(files, starts, [*starts[1:], STEPS])):
        rows = history(path)
        train = [(step, row["train/loss"]) for step, row in rows if "train/loss" in row]
        steps = [step for step, _ in train]
        if len(set(steps)) != len(steps) or steps != sorted(steps):
            problems.append(f"attempt {n + 1}: train/loss steps {steps} (a step twice or out of order)")
        if any(value != losses.get(step) for step, value in train):
            problems.append(f"attempt {n + 1}: train/loss is not the step's loss")
        wanted = list(range(start, STEPS))[: len(steps)] if n == killed else list(range(start, end))
        if steps != wanted:
            problems.append(f"attempt {n + 1}: train/loss at steps {steps}, not {wanted[0]} to {wanted[-1]}")
    return problems


def _script_env(run: Path, fault: str, slow: bool) -> dict[str, str]:
    """What the script reads from its environment: the fault planted, W&B or not, slowed steps or not."""
    wandb_home = {f"WANDB_{name}_DIR": str(run.parent / "wandb-home") for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT")}
    return dict(
        **wandb_home,
        TRACKER_FAULT=fault,
        TRACKER_WANDB="" if fault not in ("", "log-replay") else "1",
        LEGATO_CHAOS_STEP_SLEEP_S="0.1" if slow else "0",
    )


def _launch(run: Path, fault: str, slow: bool) -> subprocess.Popen:
    env = dict(os.environ, PYTHONWARNINGS="ignore", **_script_env(run, fault, slow))
    cmd = [*LAUNCH, "--master-port", str(free_port()), str(SCRIPT), str(run)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _interrupt(run: Path, how: str, at: int, fault: str) -> str:
    """One launch, interrupted from outside by pid: USR2 to the launcher alone, or SIGKILL to every process."""
    launcher = _launch(run, fault, slow=True)
    seen = {launcher.pid}
    try:
        if how == "stop":
            wait_for(lambda: steps_done(run) >= at, 180, f"step {at}")
            os.kill(launcher.pid, signal.SIGUSR2)
            _, stderr = launcher.communicate(timeout=240)
            assert launcher.returncode == 75, stderr[-3000:]
            return stderr
        wait_for(
            lambda: (run / "checkpoints" / f"step_{at}").is_dir() and _logged_past(run, at + 2),
            180,
            f"the periodic checkpoint at step {at} and TensorBoard points past it",
        )
        seen |= set(process_tree(launcher.pid))
        for pid in sorted(seen):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not [pid for pid in seen if alive(pid)], 60, "every process of the killed launch to end")
        return launcher.communicate(timeout=60)[1]
    finally:
        for pid in [launcher.pid, *process_tree(launcher.pid)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _logged_past(run: Path, step: int) -> bool:
    return (run / "tb").is_dir() and any(s >= step for s, _ in tb_points(run / "tb").get("train/loss", []))


def _planted(run: Path, how: str, at: int, fault: str) -> None:
    """The faulty script's two ranks, interrupted from outside by pid (USR2 to rank 1, or SIGKILL to both), then started
    again to the run's end."""
    with reaped(start_ranks(SCRIPT, run, 2, **_script_env(run, fault, slow=True))) as ranks:
        if how == "stop":
            wait_for(lambda: steps_done(run) >= at, 180, f"step {at}")
            ranks[1].send_signal(signal.SIGUSR2)
            assert [r.wait(timeout=240) for r in ranks] == [75, 75], stderr_tails(run)
        else:
            wait_for(
                lambda: (run / "checkpoints" / f"step_{at}").is_dir() and _logged_past(run, at + 2),
                180,
                f"the periodic checkpoint at step {at} and TensorBoard points past it",
            )
            for r in ranks:
                r.kill()
            assert [r.wait(timeout=60) for r in ranks] == [-signal.SIGKILL] * 2
    with reaped(start_ranks(SCRIPT, run, 2, **_script_env(run, fault, slow=False))) as ranks:
        assert [r.wait(timeout=300) for r in ranks] == [0, 0], stderr_tails(run)


def _finish(run: Path, fault: str) -> str:
    launcher = _launch(run, fault, slow=False)
    try:
        _, stderr = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stderr[-3000:]
    return stderr


def _ledger(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]


def test_a_scripts_dashboards_after_two_stops_and_a_hard_kill(tmp_path: Path) -> None:
    run = tmp_path / "run"
    said = [_interrupt(run, how, at, "") for how, at in MAIN]
    said.append(_finish(run, ""))
    assert dashboard_problems(run) == []

    # The stops cut epochs mid-way (else the epoch-body check proved nothing), and every resume verified.
    ledger = _ledger(run)
    stops = [e["step"] for e in ledger if e["event"] == "attempt_stopped"]
    assert len(stops) == 2 and all(step % STEPS_PER_EPOCH for step in stops), stops
    resumes = [e for e in ledger if e["event"] == "resumed"]
    assert [e["step"] for e in resumes] == [*stops, 60] and all(e["match"] and e["replay"]["identical"] for e in resumes)
    # W&B offline: the attempts that ended in order kept every point; the killed one what W&B had written.
    assert wandb_problems(run, [0, *stops, 60], killed=2) == []

    # One run id across the attempts, the attempts counted, the resumed step known to the tracker.
    identity = [line for text in said for line in text.splitlines() if line.startswith("tracker: ")]
    assert identity == [
        f"tracker: run {(run / 'run_id').read_text().strip()} attempt {n} resumed at step {s}"
        for n, s in zip((1, 2, 3, 4), (0, *stops, 60))
    ]

    # legato's own commands read the script's run.
    status = legato("status", str(run), "--json")
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["state"] == "finished" and summary["all_resumes_verified"] and summary["step"] == STEPS
    assert [a["ended"] for a in summary["attempts"]] == ["stopped", "stopped", "ended, killed", "finished"]
    assert [a["resumed_from_step"] for a in summary["attempts"]] == [None, *stops, 60]
    watch = legato("watch", str(run))
    assert watch.returncode == 0 and "FINISHED" in watch.stdout, watch.stdout + watch.stderr
    logs = legato("logs", str(run))
    assert logs.returncode == 0 and f"stopped at the committed checkpoint of step {stops[0]}" in logs.stdout, logs.stdout
    plot = legato("plot", str(run), "--out", str(tmp_path / "loss.png"))
    assert plot.returncode == 0 and (tmp_path / "loss.png").stat().st_size > 0, plot.stderr


@pytest.mark.parametrize(
    ("fault", "interruption", "caught"),
    [
        ("log-replay", ("stop", 30), "train/loss logged more than once"),
        ("no-purge", ("kill", 40), "train/loss logged more than once"),
        ("validate-after-stop", ("stop", 8), "validation ran after a stop"),
    ],
)
def test_the_dashboard_checker_catches_a_planted_fault(tmp_path: Path, fault: str, interruption: tuple[str, int], caught: str) -> None:
    run = tmp_path / "run"
    _planted(run, *interruption, fault)
    problems = dashboard_problems(run)
    assert any(p.startswith(caught) for p in problems), problems
    if fault == "log-replay":  # the same fault, logged to W&B by hand: the resumed attempt's file starts before its step
        stop = next(e["step"] for e in _ledger(run) if e["event"] == "attempt_stopped")
        assert any("train/loss at steps" in p for p in wandb_problems(run, [0, stop], killed=-1)), wandb_problems(run, [0, stop], -1)
