"""Issue 25's bad input through the real CLI: `legato run` and `python -m legato` each refuse in one paragraph on
stderr, exit 2, no traceback, and create nothing (no run directory, nothing beside the config).

Representative cases only: the fuzz over these shapes runs in-process (tests/unit/test_config_fuzz.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MLP, ROOT, TINY_GPT
from helpers.cli import assert_usage_error

GOOD = TINY_GPT.read_text()
ENV = dict(os.environ, PYTHONWARNINGS="ignore")

# name -> (config text, --set values, words the message must hold)
CASES: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "date_in_options": (GOOD, ["train.options.started=2024-01-01"], ("train.options.started", "date or time", "Quote it")),
    "binary_tag": (
        GOOD.replace("    dropout: 0.1\n", "    dropout: 0.1\n    blob: !!binary aGVsbG8=\n"),
        [],
        ("!!binary", "line 21, column 11"),
    ),
    "set_tag": (GOOD, ["train.options.tags=!!set {a, b}"], ("a set (!!set)", "Write a list instead")),
    "omap_tag": (GOOD, ["train.options.order=!!omap [a: 1]"], ("an ordered map (!!omap)",)),
    "mixed_keys": (GOOD, ["train.options.table={1: a, b: c}"], ("mapping key that is an integer", "Quote the key")),
    "python_tag": (GOOD, ["train.options.x=!!python/object/apply:os.system [id]"], ("the tag !!python/object/apply:os.system",)),
    "run_dir_dotdot": (GOOD, ["run.dir=runs/../../elsewhere"], ("run.dir", "'..' component")),
    "run_dir_tilde": (GOOD, ["run.dir=~/runs/x"], ("run.dir", "starts with '~'")),
    "run_name_slash": (GOOD.replace("  dir: runs/tiny_gpt\n", ""), ["run.name=team/x"], ("run.name", "cannot hold '/'")),
    "crlf_in_name": (GOOD.replace("name: tiny_gpt", 'name: "tiny\\r\\ngpt"'), [], ("run.name", "carriage return")),
    "cr_in_set": (GOOD, ["train.options.note=a\rb"], ("--set 'train.options.note'", "carriage return")),
    "nan_in_options": (GOOD, ["train.options.clip=.nan"], ("train.options.clip", "finite")),
    "missing_steps": (GOOD.replace("  steps: 60\n", ""), [], ("train.steps is missing", "--set train.steps=")),
    "near_miss_option": (GOOD, ["train.options.head=4"], ("train.options.head", "Did you mean train.options.heads?")),
    "mlp_batch_of_one": (MLP.read_text(), ["train.batch_size=1"], ("train.batch_size is 1", "batch norm")),
    "batch_beyond_share": (MLP.read_text(), ["train.options.samples=20"], ("train.options.samples is 20", "no full batch")),
    "model_beyond_memory": (GOOD, ["train.options.dim=4096", "train.options.layers=64"], ("GiB on each rank",)),
}


def _cli(tmp_path: Path, command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env or ENV)


def _nothing_but_the_config(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
    assert not (ROOT / "runs" / "team").exists() and not (Path.home() / "runs" / "x").exists()


# Every case through `legato run`; one of each shape through the local launcher.
ENTRIES = [("legato run", name) for name in sorted(CASES)] + [
    ("python -m legato", name) for name in ("binary_tag", "mixed_keys", "crlf_in_name", "missing_steps", "mlp_batch_of_one")
]


@pytest.mark.parametrize("entry, name", ENTRIES)
def test_bad_config_is_refused_and_creates_nothing(tmp_path: Path, entry: str, name: str) -> None:
    text, sets, needles = CASES[name]
    if "run.dir" not in " ".join(sets) and "dir: runs/tiny_gpt" in text:
        text = text.replace("dir: runs/tiny_gpt", f"dir: {tmp_path}/run")  # a config that did pass would land here, and fail
    config = tmp_path / "config.yaml"
    config.write_text(text)
    args = [arg for item in sets for arg in ("--set", item)]
    command = ["legato.orchestrator.cli", "run", str(config), *args] if entry == "legato run" else ["legato", str(config), *args]
    assert_usage_error(_cli(tmp_path, command), *needles)
    _nothing_but_the_config(tmp_path)


def test_slurm_executor_without_slurm_on_path_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text((ROOT / "configs" / "tiny_gpt_slurm.yaml").read_text().replace("dir: runs/tiny_gpt_slurm", f"dir: {tmp_path}/run"))
    env = dict(ENV, PATH=str(Path(sys.executable).parent))  # python, but no sbatch or srun
    for command in (
        ["legato.orchestrator.cli", "run", str(config)],
        ["legato.orchestrator.cli", "run", str(config), "--detach"],
        ["legato.orchestrator.cli", "verify", str(config), "--out", str(tmp_path / "verify")],
        ["legato.orchestrator.cli", "run", str(TINY_GPT), "--set", f"run.dir={tmp_path}/run", "--set", "executor=slurm"],
    ):
        proc = _cli(tmp_path, command, env)
        assert_usage_error(proc, "executor is slurm", "sbatch and srun are not on PATH", "legato devcluster up", "executor: local")
        assert "Could not detect" not in proc.stderr
        _nothing_but_the_config(tmp_path)


@pytest.mark.parametrize("args", [["--password=QQ77-launcher-secret"], ["--nproc", "QQ77-launcher-secret"], ["QQ77-launcher-secret"]])
def test_the_local_launcher_never_echoes_a_value_in_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    proc = _cli(tmp_path, ["legato", str(TINY_GPT), *args])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "QQ77" not in proc.stdout + proc.stderr
