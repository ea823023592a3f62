"""The trajectory log's buffering: a slow step's line is on disk at once, a fast loop's within the flush interval, every
line before a checkpoint (`sync`) and at close; a resume cuts what an earlier attempt logged past its step.

One process, a real file; the clock is the writer's own (monotonic), so the test waits the interval out rather than
faking it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from legato.store.trajectory import FLUSH_INTERVAL_S, TrajectoryWriter, _line, read_trajectory


def _steps(path: Path) -> list[int]:
    return [r["step"] for r in read_trajectory(path)]


def test_lines_reach_the_file_within_the_interval_and_at_every_sync(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    writer = TrajectoryWriter(path, 0)
    writer.write({"step": 1})
    writer.write({"step": 2})
    time.sleep(FLUSH_INTERVAL_S * 1.5)
    writer.write({"step": 3})  # a step slower than the interval: its line and the ones before it are on disk at once
    assert _steps(path) == [1, 2, 3]
    writer.write({"step": 4})
    writer.sync()  # before a checkpoint: everything up to it is durable, however fast the steps were
    assert _steps(path) == [1, 2, 3, 4]
    writer.write({"step": 5})
    writer.close()
    assert _steps(path) == [1, 2, 3, 4, 5]


def test_a_resume_cuts_the_lines_past_its_step(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    writer = TrajectoryWriter(path, 0)
    for step in range(1, 7):
        writer.write({"step": step})
    writer.close()
    resumed = TrajectoryWriter(path, 4)
    resumed.write({"step": 5, "again": True})
    resumed.close()
    assert [(r["step"], r.get("again", False)) for r in read_trajectory(path)] == [
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (5, True),
    ]


def test_the_writer_says_how_far_an_earlier_attempt_logged_past_the_resumed_step(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    writer = TrajectoryWriter(path, 0)
    assert writer.dropped_to is None  # nothing before it
    for step in range(1, 8):
        writer.write({"step": step})
    writer.close()
    assert TrajectoryWriter(path, 7).dropped_to is None  # a stop at step 7, resumed there: nothing lost
    assert TrajectoryWriter(path, 4).dropped_to == 7  # killed after step 7, resumed at 4: steps 5-7 lost


@given(
    step=st.integers(min_value=0, max_value=10**9),
    epoch=st.integers(min_value=0, max_value=10**6),
    loss=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    lr=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    held=st.booleans(),
)
def test_a_steps_line_is_written_as_json_dumps_writes_it(step: int, epoch: int, loss: float | None, lr: float | None, held: bool) -> None:
    """The per-step line skips json.dumps's walk: byte for byte its output, for every float (and a loss still held)."""
    loss_hex = None if loss is None else loss.hex()
    record = {"step": step, "epoch": epoch, "loss_hex": (lambda: loss_hex) if held and loss_hex else loss_hex, "lr": lr}
    assert _line(record) == json.dumps({**record, "loss_hex": loss_hex})


def test_any_other_line_goes_through_json_dumps() -> None:
    record = {"step": 4, "epoch": 0, "loss_hex": '0x1p+0"', "lr": 1.0}
    assert _line(record) == json.dumps(record)
    hashed = {"step": 4, "epoch": 0, "loss_hex": "0x1p+0", "lr": 1.0, "state_hash": "ab", "components": {"model": "cd"}}
    assert json.loads(_line(hashed)) == hashed
