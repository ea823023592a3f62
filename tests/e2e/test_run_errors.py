"""Bad input to `legato run` and friends: exit 2, one paragraph naming the problem and the fix, no traceback,
nothing submitted and nothing already saved changed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, run_ranks, run_trainer
from filelock import FileLock
from helpers.cli import assert_usage_error, legato

from legato.paths import RunPaths

GOOD = TINY_GPT.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


CASES = {
    "invalid_yaml": ("run:\n  name: x\n train: [\n", [], ("not valid YAML", "line 3")),
    "unknown_key": (
        GOOD.replace("batch_size:", "batch_sise:"),
        [],
        ("train.batch_sise is not a known key", "Did you mean train.batch_size?", "Valid keys"),
    ),
    "wrong_type": (GOOD, ["train.steps=many"], ("train.steps must be an integer", "'many'")),
    "missing_entrypoint": (GOOD, ["train.entrypoint=nosuchpkg.train:main"], ("nosuchpkg", "cannot be found", "PYTHONPATH")),
    "entrypoint_without_function": (GOOD, ["train.entrypoint=nosuchpkg"], ('"package.module:function"',)),
    "zero_time_limit": (GOOD, ["slurm.time_min=0"], ("slurm.time_min is 0", "positive")),
    "negative_time_limit": (GOOD, ["local.timeout_min=-5"], ("local.timeout_min is -5",)),
    "bad_signal": (GOOD, ["slurm.signal=USR9"], ("slurm.signal", "not a signal name")),
    "bad_executor": (GOOD, ["executor=kubernetes"], ("executor is 'kubernetes'", "local, slurm")),
    "bad_override": (GOOD, ["train.steps"], ("--set 'train.steps' is not of the form key=value",)),
    "negative_requeues": (GOOD, ["slurm.max_requeues=-1"], ("slurm.max_requeues",)),
    # issue 15: each of these once ended in a traceback, a hang or a silent acceptance
    "nan_lr": (GOOD, ["train.lr=.nan"], ("train.lr", "finite")),
    "uncatchable_signal": (GOOD, ["slurm.signal=KILL"], ("slurm.signal", "cannot use")),
    "heads_do_not_divide_dim": (GOOD, ["train.options.heads=5"], ("does not divide",)),
    "signal_rank_beyond_world": (GOOD, ["chaos.signal_rank=7"], ("chaos.signal_rank is 7",)),
    "astronomic_steps": (GOOD, ["train.steps=" + "9" * 5000], ("5000-digit number",)),
    "alias_bomb": (
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        [],
        ("billion laughs",),
    ),
    "duplicate_section": (GOOD + "train:\n  steps: 5\n", [], ("appears twice",)),
    "empty_file": ("", [], ("is empty",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_config_is_refused_before_anything_runs(tmp_path: Path, name: str) -> None:
    text, sets, needles = CASES[name]
    run_dir = tmp_path / "run"
    args = ["run", str(write(tmp_path, text)), "--set", f"run.dir={run_dir}"]
    for item in sets:
        args += ["--set", item]
    assert_usage_error(legato(*args), *needles)
    assert not (run_dir / "ledger.jsonl").exists()


def test_missing_config_file(tmp_path: Path) -> None:
    assert_usage_error(legato("run", str(tmp_path / "nope.yaml")), "nope.yaml does not exist")


def test_run_dir_of_another_config_is_left_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = GOOD.replace("steps: 60", "steps: 99").replace("dir: runs/tiny_gpt", f"dir: {run_dir}")
    (run_dir / "config.yaml").write_text(other)
    before = tree_digest(run_dir)
    proc = legato("run", str(TINY_GPT), "--set", f"run.dir={run_dir}")
    assert_usage_error(proc, "belongs to another config", "train.steps was 99, now 60", "its own run.dir")
    assert tree_digest(run_dir) == before


def test_checkpoint_from_another_world_size_is_left_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert run_trainer(TINY_GPT, run_dir, *FAST_GPT, "train.steps=4").returncode == 0
    before = tree_digest(run_dir)
    args = ["run", str(TINY_GPT), "--set", f"run.dir={run_dir}", "--set", "local.tasks=1"]
    for item in (*FAST_GPT, "train.steps=4"):
        args += ["--set", item]
    assert_usage_error(legato(*args), "written by 2 ranks, but this run has 1")
    assert tree_digest(run_dir) == before


def test_second_supervisor_refuses(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "supervisor.json").write_text(json.dumps({"pid": 4242, "host": "login1", "since": 0}))
    with FileLock(str(run_dir / "supervisor.lock")):
        proc = legato("run", str(TINY_GPT), "--set", f"run.dir={run_dir}")
    assert_usage_error(proc, "Another legato supervisor is attached", "pid 4242 on login1", "legato watch")


@pytest.mark.parametrize("command", ["status", "cancel", "logs"])
def test_commands_on_a_directory_that_is_not_a_run(tmp_path: Path, command: str) -> None:
    """(`legato watch` waits there instead, for a run to start: test_watch_waits_for_a_script_run_to_start.)"""
    assert_usage_error(legato(command, str(tmp_path)), str(tmp_path))


def test_watch_of_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("precious")
    assert_usage_error(legato("watch", str(tmp_path / "notes.txt")), "is a file, not a run directory")
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_entrypoint_that_is_not_callable_is_refused_before_submitting(tmp_path: Path) -> None:
    (tmp_path / "notcallable_ep.py").write_text("main = 42\n")
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.orchestrator.cli",
            "run",
            str(TINY_GPT),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            "train.entrypoint=notcallable_ep:main",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_usage_error(proc, "'main' in 'notcallable_ep' is a int, not a function")
    assert not run_dir.exists()


@pytest.mark.parametrize("case", ["run_dir_is_a_file", "binary_config", "utf16_config"])
def test_local_launcher_refuses_cleanly(tmp_path: Path, case: str) -> None:
    config, sets = TINY_GPT, []
    if case == "run_dir_is_a_file":
        (tmp_path / "taken").write_text("precious")
        sets = ["--set", f"run.dir={tmp_path / 'taken'}"]
    else:
        config = tmp_path / "config.yaml"
        config.write_bytes(bytes(range(256)) if case == "binary_config" else GOOD.encode("utf-16"))
    proc = subprocess.run(
        [sys.executable, "-m", "legato", str(config), "--nproc", "2", *sets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert_usage_error(proc, "is a file, not a directory" if case == "run_dir_is_a_file" else "binary or UTF-16")
    if case == "run_dir_is_a_file":
        assert (tmp_path / "taken").read_text() == "precious"


def test_a_refusal_on_one_rank_ends_the_job_instead_of_leaving_the_others_waiting(tmp_path: Path) -> None:
    """Rank 0 refuses a setting during start-up while rank 1 waits for it (as a strict-mode CUDA setting once did on
    a GPU): the run ends with exit 2 and the supervisor cancels the job at once instead of leaving rank 1 waiting for
    the collective timeout (an hour here).

    Rank 1 waits the way an NCCL collective waits for a peer that has gone: without noticing. A gloo barrier would
    not do: gloo reads the connection reset as rank 0 exits and fails rank 1 itself, so the job sometimes ended
    before the supervisor looked and the cancel under test never had to happen."""
    (tmp_path / "one_refuses.py").write_text(
        "import threading\n"
        "from legato.errors import UsageError\n\n\n"
        "def main(ctx):\n"
        "    if ctx.rank == 0:\n"
        "        raise UsageError('planted: rank 0 refuses a setting.')\n"
        "    threading.Event().wait(3600)\n"
    )
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(tmp_path))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato.orchestrator.cli",
            "run",
            str(TINY_GPT),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            "train.entrypoint=one_refuses:main",
            "--set",
            "train.collective_timeout_s=3600",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "planted: rank 0 refuses a setting." in proc.stdout + proc.stderr
    events = [json.loads(line)["event"] for line in RunPaths(run_dir).ledger.read_text().splitlines()]
    assert "leftover_cancel" in events, events
    deadline = time.monotonic() + 120
    while subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the job's ranks still run after the run failed"
        time.sleep(1)


def test_run_dir_of_a_scripts_own_session_is_left_alone(tmp_path: Path) -> None:
    """`legato run` into the directory of a run a user's script launches (stopped, then finished) is refused by name, not
    mistaken for its own: stopped, it would continue the script's checkpoints with another loop; finished, it said
    "already completed" of a training it never ran."""
    run_dir = tmp_path / "run"
    script = [sys.executable, str(ROOT / "examples" / "own_loop.py"), str(run_dir), "--steps", "12"]

    def assert_refused_untouched() -> None:
        before = tree_digest(run_dir)
        proc = legato("run", str(TINY_GPT), "--set", f"run.dir={run_dir}")
        assert_usage_error(proc, "holds a run of a script's own legato.Session", "Launch that script again", "its own run.dir")
        assert tree_digest(run_dir) == before
        assert not RunPaths(run_dir).config.exists()

    assert [p.returncode for p in run_ranks([*script, "--signal-at", "4"], timeout=120, PYTHONPATH=str(ROOT))] == [75, 75]
    assert_refused_untouched()
    assert [p.returncode for p in run_ranks(script, timeout=120, PYTHONPATH=str(ROOT))] == [0, 0]
    assert_refused_untouched()
