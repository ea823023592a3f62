"""`legato verify` tells where it stands: which run, its step, and an ETA for the whole verification.

The live line is driven with readings as the supervisor hands them over (a terminal stream, so every reading is
drawn). A `verify --command` launch is a real process writing its progress file, read while it runs; a file an
earlier launch left in the same run directory is not taken for this one's.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from legato.events import Kind
from legato.orchestrator.display import LiveView
from legato.orchestrator.verify_command import launch
from legato.paths import RunPaths


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def reading(step: int, total: int = 100, rate: float = 10.0) -> dict:
    return {"job_id": "7", "restart": 0, "step": step, "total_steps": total, "loss": 0.5, "steps_per_s": rate}


def test_the_reference_runs_eta_covers_the_interrupted_run_and_each_run_is_named() -> None:
    out = Terminal()
    view = LiveView(out)
    view.begin_run("reference", 1)
    view(Kind.PROGRESS, reading(10))  # 90 steps left here and 100 in the interrupted run, at 10 steps/s
    assert out.getvalue().endswith("reference | step 10/100 | loss 0.5000 | 10.0 steps/s | ETA 0m19s (all runs)")
    view(Kind.FINISHED, {"event": Kind.FINISHED, "step": 100, "final_global_hash": "ab" * 16})
    view.begin_run("interrupted", 0)
    view(Kind.PROGRESS, reading(5))  # steps count from 0 again: not taken for a stale reading of the reference
    assert out.getvalue().endswith("interrupted | step 5/100 | loss 0.5000 | 10.0 steps/s | ETA 0m09s")


def test_a_plain_live_line_is_unchanged_by_the_runs_label() -> None:
    out = Terminal()
    view = LiveView(out)
    view(Kind.ATTEMPT_STARTED, {"event": Kind.ATTEMPT_STARTED, "job_id": "7", "restart": 0, "hosts": ["n1"], "world_size": 2})
    view(Kind.PROGRESS, reading(50))
    assert out.getvalue().endswith("attempt 1 | step 50/100 | loss 0.5000 | 10.0 steps/s | ETA 0m05s")


def test_a_launch_hands_over_its_own_progress_while_it_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunPaths(run_dir).progress.write_text(json.dumps(reading(99)))  # an earlier launch's last reading
    writer = (
        "import json, os, sys, time\n"
        "path = os.path.join(sys.argv[1], 'progress.json')\n"
        "for step in (1, 2, 3):\n"
        "    tmp = path + '.tmp'\n"
        "    open(tmp, 'w').write(json.dumps({'step': step, 'total_steps': 3}))\n"
        "    os.replace(tmp, path)\n"
        "    time.sleep(1.5)\n"
    )
    heard: list[dict] = []
    code = launch([sys.executable, "-c", writer, "{run_dir}"], run_dir, tmp_path / "log", {}, 120, heard.append)
    assert code == 0
    steps = [r["step"] for r in heard]
    assert 99 not in steps and steps == sorted(set(steps)) and steps, steps
