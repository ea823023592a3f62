"""Secrets never reach the run directory or any CLI output, with real processes.

Every planted format (helpers/planted_secrets.py) goes into the environment, the command line (`--set`) and the
config file of a real `legato run` with a stop, and then no file of the run directory and no output of
`legato run`, `status`, `logs`, `repro show` and `repro diff` may hold any of them verbatim. The redactor cannot
hang on hostile text (a subprocess with a bounded wait). The rules, in one process: unit/test_secrets.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FAST_GPT, ROOT, TINY_GPT
from helpers.planted_secrets import ALLOWLISTED_PLANTS, FORMATS, SECRETS


def _files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file()]


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "legato.orchestrator.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _yaml_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.mark.slow
def test_no_planted_secret_reaches_the_run_directory_or_any_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = yaml.safe_load(TINY_GPT.read_text())
    config["train"]["options"].update({f"cfg_{name}": value for name, (value, _) in FORMATS.items()})
    config["train"]["options"]["deploy_password"] = "QQ77config-secret-value"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    args = ["run", str(config_path), "--set", f"run.dir={run_dir}"]
    for item in (
        *FAST_GPT,
        "chaos.signal_at_steps=[5]",
        *(f"train.options.arg_{name}={_yaml_quoted(value)}" for name, (value, _) in FORMATS.items()),
    ):
        args += ["--set", item]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **{f"PLANT_{n.upper()}": v for n, (v, _) in FORMATS.items()}, **ALLOWLISTED_PLANTS)
    secrets = [*SECRETS, "QQ77config-secret-value"]

    outputs = [_cli(*args, env=env)]
    assert outputs[0].returncode == 0, outputs[0].stdout[-2000:] + outputs[0].stderr[-2000:]
    job = next(e["job_id"] for e in map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines()) if e["event"] == "submitted")
    outputs += [
        _cli("status", str(run_dir), env=env),
        _cli("status", str(run_dir), "--json", env=env),
        _cli("logs", str(run_dir), env=env),
        _cli("repro", "show", f"{job}/0", "--run", str(run_dir), env=env),
        _cli("repro", "show", f"{job}/1", "--run", str(run_dir), env=env),
        _cli("repro", "diff", f"{job}/0", f"{job}/1", "--run", str(run_dir), env=env),
    ]
    files = _files(run_dir)
    assert (
        any(p.name == "env.txt" for p in files)
        and any(p.name == "config.txt" for p in files)
        and any(p.name == "command.txt" for p in files)
    )
    assert len([p for p in files if p.name == "env.txt"]) >= 2, "a capture for every attempt"
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret!r} found in {path}"
    for proc in outputs:
        for secret in secrets:
            assert secret not in proc.stdout + proc.stderr, f"{secret!r} in the output of {proc.args[3:6]}"
    shown = outputs[4].stdout
    assert "PLANT_STRIPE_LIVE=<not recorded: fingerprint " in shown and "TORCH_HUB_TOKEN=<not recorded: fingerprint " in shown
    assert f"PATH={os.environ['PATH']}" in shown, "allowlisted values are recorded"
    assert "== env ==" not in outputs[6].stdout, "fingerprints are stable within the run directory"


def test_redaction_cannot_hang_on_hostile_text() -> None:
    """Git diffs and command output can be megabytes of anything; a pattern that backtracks over itself would
    hold a capture for hours (the first assignment rule took 24 s on 4 KB of `a.a.a...`). Bounded wait, no timing."""
    code = (
        "from legato.repro.redact import Redactor\n"
        "r = Redactor()\n"
        "for t in ['a.' * 50000, 'a' * 100000, '://' + 'a' * 100000, '://a' * 25000, 'password.' * 10000, '?a.' * 30000, 'pass' * 25000]:\n"
        "    r.words(r.text(t))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
