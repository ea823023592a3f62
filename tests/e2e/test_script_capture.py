"""A script's own Session captures each attempt's environment as `legato run` does: once per node (not per rank), in
RUN/repro/JOB/ATTEMPT, recorded in the ledger, compared by `legato status` ("same", or the sections that changed)
and diffed by `legato repro diff`; a secret in the environment reaches no file, and the capture runs in a process of
its own, so the ranks never wait for it."""

from __future__ import annotations

from pathlib import Path

from helpers.cli import ledger, legato, status, wait_for
from helpers.launches import ROOT, reaped, start_ranks

SCRIPT = ROOT / "tests" / "helpers" / "session_end.py"
SECRET = "planted-capture-secret-7f3a9c"


def attempt(out: Path, code: int, **env: str) -> None:
    """One two-rank attempt of the script (8 steps, stopped after steps 3 and 6 from its environment, as every attempt
    is launched alike), its exit `code`, and its capture recorded."""
    with reaped(start_ranks(SCRIPT, out, 2, STEPS="8", LEGATO_CHAOS_SIGNAL_AT="3,6", MY_SERVICE_TOKEN=SECRET, **env)) as procs:
        assert [p.wait(timeout=300) for p in procs] == [code, code], (out / "rank0.stderr").read_text()[-3000:]
    done = len([e for e in ledger(out) if e["event"] == "attempt_started"])
    wait_for(lambda: len(captures(out)) >= done, what=f"the capture of attempt {done}")


def captures(out: Path) -> list[dict]:
    return [e for e in ledger(out) if e["event"] in ("repro_captured", "repro_failed")]


def test_each_attempt_of_a_script_run_captures_its_environment_once_per_node(tmp_path: Path) -> None:
    out = tmp_path / "run"
    attempt(out, 75)
    attempt(out, 75)
    attempt(out, 0, NCCL_DEBUG="INFO")  # the planted change: an allowlisted variable

    found = captures(out)
    assert [(e["event"], e["job_id"], e["restart"], e["node"]) for e in found] == [
        ("repro_captured", "script", restart, 0) for restart in range(3)
    ], found
    for restart in range(3):
        assert (out / "repro" / "script" / str(restart) / "manifest.json").is_file()
    attempts = status(out)["attempts"]
    assert [a["environment_changed"] for a in attempts] == [None, [], ["env"]], attempts

    diff = legato("repro", "diff", str(out / "repro" / "script" / "1"), str(out / "repro" / "script" / "2"))
    assert diff.returncode == 1 and "+ NCCL_DEBUG=INFO" in diff.stdout, diff.stdout + diff.stderr  # 1: they differ, as diff(1)
    leaked = [p for p in (out / "repro").rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert not leaked and SECRET not in (out / "ledger.jsonl").read_text(), leaked
