"""The command line's manners: `--version`, a reader that goes away, and usage errors that never echo a value."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_GPT

from legato.orchestrator import arguments
from legato.orchestrator.cli import main
from legato.paths import RunPaths

SECRET = "hunter2-Zq9xVv7Lp3"
CLI = [sys.executable, "-m", "legato.orchestrator.cli"]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"legato {importlib.metadata.version('legato')}\n"


def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    line = next(x for x in (ROOT / "pyproject.toml").read_text().splitlines() if x.startswith("version"))
    assert arguments.version() == line.split('"')[1]


def test_version_does_not_import_torch() -> None:
    code = (
        "from legato.orchestrator.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass\nimport sys\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines() == [f"legato {importlib.metadata.version('legato')}", "NO-TORCH"], proc.stdout + proc.stderr


def test_the_local_launcher_starts_its_ranks_without_importing_torch_itself(tmp_path: Path) -> None:
    """`python -m legato` only starts and watches ranks: importing torch there cost every launch 1.4 s of CPU before
    the ranks (which import it themselves) could start."""
    args = [
        str(ROOT / "configs" / "mlp.yaml"),
        "--nproc",
        "2",
        "--set",
        f"run.dir={tmp_path / 'run'}",
        "--set",
        "train.steps=2",
        "--set",
        "chaos.signal_at_steps=[]",
    ]
    code = (
        f"import sys\nfrom legato.runtime.launch import main\ncode = main({args!r})\n"
        "print('CODE', code, 'TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "CODE 0 NO-TORCH", proc.stdout[-2000:] + proc.stderr[-3000:]


def _run_dir(tmp_path: Path, log_bytes: int = 0) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    events = [{"event": "run_started", "time": 0.0, "command": []}, {"event": "submitted", "time": 1.0, "job_id": "42"}]
    RunPaths(run_dir).ledger.write_text("".join(json.dumps(e) + "\n" for e in events))
    if log_bytes:
        log = RunPaths(run_dir).task_log("42", 0, "out")
        log.parent.mkdir(parents=True)
        log.write_text("".join(f"line {i} of the task's output\n" for i in range(log_bytes // 24)))
    return run_dir


def _assert_quiet_end(code: int, stderr: str) -> None:
    assert code == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr


def test_status_into_a_pipe_the_reader_already_closed_ends_quietly(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*CLI, "status", str(run_dir), "--json"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    _assert_quiet_end(proc.returncode, proc.stderr)


def test_logs_into_head_ends_quietly(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, log_bytes=4 << 20)  # far beyond a pipe's buffer: the writer must meet the closed pipe
    legato = subprocess.Popen([*CLI, "logs", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-1"], stdin=legato.stdout, stdout=subprocess.PIPE)
    legato.stdout.close()  # head alone holds the read end, so its exit closes the pipe
    first, _ = head.communicate(timeout=60)
    stderr = legato.stderr.read().decode()
    legato.stderr.close()
    assert first.decode().startswith("==> ") and first.count(b"\n") == 1
    _assert_quiet_end(legato.wait(timeout=60), stderr)


USAGE_ERRORS = {
    "unknown_flag_equals": ["run", "configs/tiny_gpt.yaml", f"--password={SECRET}"],
    "unknown_flag_space": ["run", "configs/tiny_gpt.yaml", "--password", SECRET],
    "unknown_flag_first": ["run", "--password", SECRET, "configs/tiny_gpt.yaml"],
    "bad_int": ["logs", "somewhere", "--rank", SECRET],
    "bad_choice": ["verify", "--executor", SECRET],
    "value_for_a_switch": ["run", "configs/tiny_gpt.yaml", f"--detach={SECRET}"],
    "ambiguous_flag": ["verify", "configs/tiny_gpt.yaml", f"--s={SECRET}"],
    "bad_command": [SECRET],
    "bad_subcommand": ["repro", SECRET],
}


@pytest.mark.parametrize("name", sorted(USAGE_ERRORS))
def test_argument_errors_name_the_flag_but_never_the_value(capsys: pytest.CaptureFixture[str], name: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(USAGE_ERRORS[name])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert SECRET not in out + err, err
    assert "Traceback" not in err and "\n\n" not in err.strip() and "error: " in err, err
    flag = next((a.split("=")[0] for a in USAGE_ERRORS[name] if a.startswith("--")), None)
    if flag in ("--password", "--rank", "--executor", "--detach"):
        assert flag in err, err


@pytest.mark.parametrize(
    ("argv", "suggested"), [(["staus", "somewhere"], "status"), (["repro", "dif"], "diff"), (["verify", "--executor", "loacl"], "local")]
)
def test_a_mistyped_command_or_choice_gets_the_closest_one_suggested(
    capsys: pytest.CaptureFixture[str], argv: list[str], suggested: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().endswith(f"did you mean {suggested!r}?"), err


@pytest.mark.parametrize(
    "item", [f"train..steps={SECRET}", f"nosuch.key={SECRET}", f"train.steps.deeper={SECRET}", f"train.options=[{SECRET}"]
)
def test_set_errors_name_the_key_but_never_the_value(capsys: pytest.CaptureFixture[str], tmp_path: Path, item: str) -> None:
    code = main(["run", str(TINY_GPT), "--set", f"run.dir={tmp_path / 'run'}", "--set", item])
    out, err = capsys.readouterr()
    assert code == 2
    assert SECRET not in out + err, err
    assert err.startswith("error: ") and "\n" not in err.strip(), err
    assert item.split("=")[0].split(".")[0] in err, err
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


SCRIPT_RUN = """
import sys, torch, legato
model = torch.nn.Linear(2, 1)
session = legato.Session(sys.argv[1], model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), total_steps=3)
for _ in session:
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    session.report(loss)
sys.exit(session.exit_code)
"""


def test_watch_waits_for_a_script_run_to_start(tmp_path: Path) -> None:
    """`legato watch` right after sbatch, before any rank wrote: it waits (a script's run has no config), then follows the run
    that starts there to its end. It used to exit 2, 'not a legato run directory (it has no config.yaml)'."""
    run_dir = tmp_path / "run"
    watch = subprocess.Popen(
        [sys.executable, "-m", "legato.orchestrator.cli", "watch", str(run_dir)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().startswith(f"legato: waiting for a run to start in {run_dir}")
        script = tmp_path / "train.py"
        script.write_text(SCRIPT_RUN)
        assert subprocess.run([sys.executable, str(script), str(run_dir)], timeout=300).returncode == 0
        out, err = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, err[-2000:]
    assert "FINISHED, step 3/3" in out, out
