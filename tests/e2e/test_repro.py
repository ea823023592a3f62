"""Environment capture per job and attempt, with real processes: secrets never reach the disk, diffs name exactly
what changed, and a hanging external command cannot hold a capture past its timeout. The redactor alone, in one
process: unit/test_repro_redactor.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT
from helpers.cli import ledger, legato, status, wait_for
from helpers.planted_secrets import REPRO_SECRET_VALUES as SECRET_VALUES
from helpers.planted_secrets import REPRO_SECRETS as SECRETS

HOOK_TOKEN = "T0K3Nnotify7hook9secret"


def _run_dir_files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_no_secret_reaches_any_file_of_a_real_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(
        TINY_GPT.read_text().replace(
            "    dropout: 0.1\n",
            "    dropout: 0.1\n    wandb_api_key: QQ77config-secret-value\n    db: mysql://me:pw-in-config-url-9@host/db\n",
        )
    )
    args = ["run", str(config), "--set", f"run.dir={run_dir}", "--set", "train.options.hf_token=cmdline-secret-value-0042"]
    for item in (*FAST_GPT, "chaos.signal_at_steps=[5]"):
        args += ["--set", item]
    # The end hook: it reports through its environment, its webhook's token reaches no file, and its failure (exit 3)
    # leaves the run's exit code alone.
    notified = tmp_path / "notified"
    hook = (
        f'printf "%s|%s|%s" "$LEGATO_RUN_STATE" "$LEGATO_RUN_DIR" "$LEGATO_RUN_REASON" > {shlex.quote(str(notified))}; '
        f"exit 3  # https://hooks.example/services/{HOOK_TOKEN}"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore", LEGATO_NOTIFY_COMMAND=hook, **SECRETS)
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "train.options.hf_token looks secret" in proc.stderr
    assert notified.read_text() == f"finished|{run_dir.resolve()}|"
    assert "LEGATO_NOTIFY_COMMAND exited 3; the run's result is unchanged" in proc.stderr, proc.stderr[-2000:]
    files = _run_dir_files(run_dir)
    assert any(p.parent.name == "0" and p.name == "env.txt" for p in files) and any("_log.err" in p.name for p in files)
    # `legato run` returned once its job had ended: the job's result is written, no file of it is half written.
    assert any(p.name.endswith("_result.pkl") for p in files) and not [p for p in files if p.name.endswith("save_tmp")], files
    for path in files:
        data = path.read_bytes()
        for secret in (*SECRET_VALUES, HOOK_TOKEN):
            assert secret.encode() not in data, f"{secret!r} found in {path}"
    env_text = next(p for p in files if p.name == "env.txt").read_text()
    assert "GITHUB_TOKEN=<not recorded: fingerprint " in env_text
    assert "MY_SETTING=<not recorded: fingerprint " in env_text


def _fake_distribution(site: Path, version: str) -> None:
    for old in site.glob("legatofake-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"legatofake-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: legatofake\nVersion: {version}\n")


def _job(run_dir: Path, env: dict, *sets: str) -> str:
    """Start a job of the run (detached), wait for its environment capture, cancel it; returns its job id."""
    args = ["run", str(TINY_GPT), "--set", f"run.dir={run_dir}", "--detach"]
    # Identical settings for every job (the run is continued); the signal after step 3 only fires in the first.
    for item in (*FAST_GPT, "train.steps=100000", "checkpoint.every_steps=0", "chaos.signal_at_steps=[3]", *sets):
        args += ["--set", item]
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    job = [e for e in ledger(run_dir) if e["event"] in ("submitted", "resubmitted")][-1]["job_id"]
    wait_for(lambda: any(e["event"] == "repro_captured" and e["job_id"] == job for e in ledger(run_dir)), what="a capture")
    return job


def _cancel(run_dir: Path) -> None:
    assert legato("cancel", str(run_dir)).returncode == 0
    wait_for(lambda: status(run_dir)["state"] == "cancelled", what="cancelled")
    wait_for(lambda: legato("watch", str(run_dir)).returncode == 1, what="the supervisor to let go")


@pytest.mark.slow
def test_diff_names_exactly_ld_preload_and_a_package_version(tmp_path: Path) -> None:
    run_dir, site = tmp_path / "run", tmp_path / "site"
    _fake_distribution(site, "1.0")
    base = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(site))
    base.pop("LD_PRELOAD", None)

    first = _job(run_dir, base)
    wait_for(lambda: (run_dir / "repro" / first / "1" / "manifest.json").exists(), what="the second attempt's capture")
    _cancel(run_dir)
    preload = _job(run_dir, {**base, "LD_PRELOAD": "/lib/x86_64-linux-gnu/libm.so.6"})
    _cancel(run_dir)
    _fake_distribution(site, "1.1")
    upgraded = _job(run_dir, base)
    _cancel(run_dir)

    same = legato("repro", "diff", f"{first}/0", f"{first}/1", "--run", str(run_dir))
    assert same.returncode == 0 and "no difference" in same.stdout, same.stdout

    env_diff = legato("repro", "diff", f"{first}/0", f"{preload}/0", "--run", str(run_dir))
    assert env_diff.returncode == 1
    assert env_diff.stdout.count("== ") == 1 and "== env ==" in env_diff.stdout, env_diff.stdout
    changed = [line.strip() for line in env_diff.stdout.splitlines() if line.startswith("  ")]
    assert changed == ["+ LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6"], changed

    pkg_diff = legato("repro", "diff", str(run_dir / "repro" / first / "0"), str(run_dir / "repro" / upgraded / "0"))
    assert pkg_diff.returncode == 1
    assert pkg_diff.stdout.count("== ") == 1 and "== packages ==" in pkg_diff.stdout, pkg_diff.stdout
    assert [line.strip() for line in pkg_diff.stdout.splitlines() if line.startswith("  ")] == ["~ legatofake: 1.0 -> 1.1"]

    attempts = status(run_dir)["attempts"]
    assert [a["environment_changed"] for a in attempts] == [None, [], ["env"], ["env", "packages"]]
    assert "CHANGED: env" in legato("status", str(run_dir)).stdout
    shown = legato("repro", "show", f"{preload}", "--run", str(run_dir), "--section", "env")
    assert shown.returncode == 0 and "LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6" in shown.stdout


def test_a_hanging_nvidia_smi_cannot_hold_the_capture(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\nsleep 120\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    dest = tmp_path / "capture"
    # The fake sleeps 120 s: were the capture to wait for it (or for its children holding the pipe), this
    # bounded run would time out and fail, however slow the machine is.
    proc = subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", "repro", "capture", str(dest), "--timeout", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["commands"]["gpu"] == {"ok": False, "error": "timed out after 1s", "seconds": manifest["commands"]["gpu"]["seconds"]}
    assert manifest["commands"]["gpu"]["seconds"] >= 1.0
    assert "gpu: timed out after 1s (recorded)" in proc.stdout
