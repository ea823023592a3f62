"""The installed package, with real processes: one top-level name, `legato`; a user's own trainer.py, slurm.py and
orchestrator.py cannot shadow it; commands that only read files never import torch. The package graph, read
without running anything: unit/test_package_arrows.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT

LEGATO = Path(sys.executable).parent / "legato"
SHADOWS = ("trainer", "slurm", "orchestrator")


def test_only_legato_is_importable_at_the_top_level(tmp_path: Path) -> None:
    probe = "import importlib.util, json, sys; print(json.dumps({n: importlib.util.find_spec(n) is not None for n in sys.argv[1:]}))"
    proc = subprocess.run(
        [sys.executable, "-c", probe, "legato", *SHADOWS], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(proc.stdout) == {"legato": True, "trainer": False, "slurm": False, "orchestrator": False}


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("legato-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"legato", wheel.name.split("-py")[0] + ".dist-info"}
    assert {"legato/session/session.py", "legato/orchestrator/cli.py", "legato/slurm/devcluster.py", "legato/tasks/tiny_gpt.py"} <= set(
        names
    )


@pytest.mark.parametrize(
    "code",
    [
        "import legato.errors",
        "import legato; legato.UsageError",
        "from legato.orchestrator.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
        "from legato.orchestrator.cli import main\ntry:\n    main(['status', '--help'])\nexcept SystemExit:\n    pass",
    ],
    ids=["errors", "package", "help", "status-help"],
)
def test_reading_commands_do_not_import_torch(code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip().endswith("NO-TORCH"), proc.stdout + proc.stderr


def test_status_logs_and_cancel_of_a_run_do_not_import_torch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ledger.jsonl").write_text(json.dumps({"event": "run_started", "time": 0.0, "command": []}) + "\n")
    code = (
        "import sys\nfrom legato.orchestrator.cli import main\n"
        f"codes = [main(['status', {str(run_dir)!r}, '--json']), main(['logs', {str(run_dir)!r}])]\n"
        "print('CODES', codes, 'TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "NO-TORCH" in proc.stdout, proc.stdout + proc.stderr


def test_a_folder_named_legato_beside_the_users_script_does_not_shadow_the_package(tmp_path: Path) -> None:
    (tmp_path / "legato" / "checkpoints").mkdir(parents=True)  # e.g. the script's run directory
    (tmp_path / "train.py").write_text("import legato\nprint(legato.Session.__module__)\n")
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "legato.session.session"


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A user's project folder with modules named like legato's repository folders; each would leave a mark."""
    project = tmp_path / "project"
    project.mkdir()
    for name in SHADOWS:
        (project / f"{name}.py").write_text(
            f"from pathlib import Path\nPath(__file__).with_name('{name}.ran').touch()\nraise SystemExit(0)\n"
        )
    return project


def _sets(run_dir: Path) -> list[str]:
    args = ["--set", f"run.dir={run_dir}", "--set", "train.steps=4"]
    for item in FAST_GPT:
        if not item.startswith("train.steps="):
            args += ["--set", item]
    return args


def _env(project: Path) -> dict[str, str]:
    # As a user who runs from their project folder with it on PYTHONPATH.
    return dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(project))


@pytest.mark.slow
def test_a_user_folder_with_its_own_trainer_slurm_and_orchestrator_modules(user_project: Path, tmp_path: Path) -> None:
    env = _env(user_project)
    runs = {
        "python -m legato": [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", *_sets(tmp_path / "m")],
        "legato train": [str(LEGATO), "train", str(TINY_GPT), *_sets(tmp_path / "t")],
        "legato run": [str(LEGATO), "run", str(TINY_GPT), *_sets(tmp_path / "r")],
    }
    for what, cmd in runs.items():
        proc = subprocess.run(cmd, cwd=user_project, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{what}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    for run in ("m", "t", "r"):
        assert (tmp_path / run / "checkpoints" / "step_4" / "manifest.json").is_file(), run
    assert sorted(p.name for p in user_project.glob("*.ran")) == []
    status = subprocess.run(
        [str(LEGATO), "status", str(tmp_path / "r"), "--json"], cwd=user_project, env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(status.stdout)["finished"] is True
    assert ROOT.joinpath("pyproject.toml").is_file()
