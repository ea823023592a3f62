"""State legato does not save is named before the first resume, with real ranks (2, gloo) and real stop signals.

The loops (helpers/ema_loops.py) keep an EMA of the model. Left unregistered,
the EMA is the held-out fault: every resume verifies (the EMA feeds no loss)
yet the final EMA weights differ from the uninterrupted run's. The census must
name it on rank 0 before the first resume says "verified", record it in the
ledger, and refuse it in strict mode; a registered or ignored EMA must draw
no warning at all (no false alarm). The finder's own logic: unit/test_census.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_GPT, codes, run_ranks

from legato.paths import RunPaths

pytestmark = pytest.mark.slow

LOOPS = ROOT / "tests" / "helpers" / "ema_loops.py"
WARNING = "legato does not save 1 stateful object(s)"
STOPS = {"LEGATO_CHAOS_SIGNAL_AT": "3,7", "LEGATO_CHAOS_SIGNAL_RANK": "1"}


def launch(run_dir: Path, *args: str, **env: str) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(LOOPS), str(run_dir), *args], **env)


def ema_digests(run_dir: Path) -> list[str]:
    return [(run_dir / f"ema_rank{rank}.txt").read_text() for rank in range(2)]


def unsaved_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in RunPaths(run_dir).ledger.read_text().splitlines()]
    return [r for r in records if r["event"] == "unsaved_state"]


def test_unregistered_manual_ema_resumed_twice_is_named_before_the_first_resume(tmp_path: Path) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert codes(launch(reference, "--ema", "manual")) == [0, 0]
    attempts = [launch(resumed, "--ema", "manual", **STOPS) for _ in range(3)]
    assert [codes(a) for a in attempts] == [[75, 75], [75, 75], [0, 0]], attempts[-1][0].stderr[-3000:]
    for attempt in attempts:
        rank0, rank1 = attempt[0].stderr, attempt[1].stderr
        assert rank0.count(WARNING) == 1 and WARNING not in rank1, rank0[-3000:]
        assert "torch.nn.modules.container.Sequential (module, 129 elements" in rank0 and "found as ema (local of train()" in rank0
        assert "Session(..., extras={'ema': ema})" in rank0 and "Session(..., ignore=[obj])" in rank0
    second = attempts[1][0].stderr
    assert second.index(WARNING) < second.index("resumed at step 4"), second[-3000:]
    # The fault the warning names is real: every resume verified, and the EMA still differs.
    assert ema_digests(resumed) != ema_digests(reference)
    records = unsaved_records(resumed)
    assert [r["when"] for r in records] == ["start"] * 3
    assert all(r["objects"][0]["where"].startswith("ema (local of train()") and r["objects"][0]["ranks"] == [0, 1] for r in records)
    assert not any(r["strict"] for r in records)


@pytest.mark.parametrize("kind", ["registered", "ignored"])
def test_registered_or_ignored_ema_draws_no_warning(tmp_path: Path, kind: str) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    runs = [launch(reference, "--ema", kind, "--census", "strict")]
    runs += [launch(resumed, "--ema", kind, "--census", "strict", **STOPS) for _ in range(3)]
    assert [codes(r) for r in runs] == [[0, 0], [75, 75], [75, 75], [0, 0]], runs[-1][0].stderr[-3000:]
    assert not any("does not save" in p.stderr for run in runs for p in run)
    assert not unsaved_records(resumed)
    if kind == "registered":
        assert ema_digests(resumed) == ema_digests(reference)


def test_strict_session_refuses_an_unregistered_averaged_model_before_the_first_step(tmp_path: Path) -> None:
    procs = launch(tmp_path, "--ema", "averaged", "--census", "strict")
    assert codes(procs) == [2, 2], procs[0].stderr[-3000:]
    for proc in procs:  # each rank says its refusal (one paragraph), and no traceback
        assert proc.stderr.count("legato does not save 1 stateful object(s)") == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "torch.optim.swa_utils.AveragedModel (module" in proc.stderr and "refuses to train" in proc.stderr
    assert not list((tmp_path / "checkpoints").glob("step_*")) and not (tmp_path / "trajectory" / "rank0.jsonl").exists()
    assert unsaved_records(tmp_path)[0]["strict"] is True


def test_determinism_mode_strict_refuses_with_exit_2_and_one_paragraph(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(LOOPS.parent))
    cmd = [
        sys.executable,
        "-m",
        "legato",
        str(TINY_GPT),
        "--nproc",
        "2",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "train.entrypoint=ema_loops:entry",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "torch.optim.swa_utils.AveragedModel (module" in out and "ema (local of train()" in out and "Traceback" not in out
    assert not list((tmp_path / "checkpoints").glob("step_*"))
