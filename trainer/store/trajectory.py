"""Per-rank trajectory log: one JSON line per step, for step-by-step comparison of runs.

Each line holds at least `step`, `loss_hex` (float.hex of the loss, exact) and
`lr`; every N steps also the rank's state hash. On resume the log is cut back
to the resumed step, so it always describes the path that the surviving state
took. Lines are buffered and reach the file within FLUSH_INTERVAL_S and before
every checkpoint (`sync`): a write call per step costs more than the line (the
lines a crash loses are past the last checkpoint, and a resume cuts those
anyway), while whoever follows the file (tests, `tail -f`) still sees a
slow step's line at once. A value may be a function of no arguments (a loss
not read back from its device yet), called when its line is written, so a
step's line costs no wait for the device. It must never write anything but
plain JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import IO, Any

from legato.files import read_json_lines, write_atomic

FLUSH_INTERVAL_S = 0.2


def read_trajectory(path: Path) -> list[dict]:
    """All complete lines of a trajectory; a torn last line (after a crash) is dropped."""
    return read_json_lines(path)


class TrajectoryWriter:
    """Appends records to one rank's trajectory file, first dropping the records after `resume_step` left by an earlier attempt."""

    def __init__(self, path: Path, resume_step: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        found = read_trajectory(path)
        kept = [r for r in found if r["step"] <= resume_step]
        # How far an earlier attempt trained past the step resumed: the work it lost (None when it lost none).
        self.dropped_to: int | None = max((r["step"] for r in found), default=resume_step) if len(kept) < len(found) else None
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file: IO[str] = path.open("a")
        self._unwritten: list[dict] = []
        self._flushed = time.monotonic()

    def write(self, record: dict) -> None:
        self._unwritten.append(record)
        if time.monotonic() - self._flushed >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        """Write out every line held back, calling the functions that stand for values."""
        lines = "".join(_line(record) + "\n" for record in self._unwritten)
        self._unwritten = []
        self._file.write(lines)
        self._file.flush()
        self._flushed = time.monotonic()

    def sync(self) -> None:
        self.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self.sync()
        self._file.close()


# The keys of every step's line without a state hash, in the order Telemetry.record writes them.
STEP_KEYS = ("step", "epoch", "loss_hex", "lr")


def _line(record: dict) -> str:
    """One record as its JSON line. A step's plain line is written as json.dumps writes it, without its generic walk
    (every step of every run writes one); anything else, and a value it would not write the same way, goes through it."""
    if tuple(record) == STEP_KEYS:
        step, epoch, loss_hex, lr = record.values()
        if callable(loss_hex):
            loss_hex = loss_hex()
        plain_numbers = type(step) is int and type(epoch) is int and (lr is None or (type(lr) is float and math.isfinite(lr)))
        if plain_numbers and (loss_hex is None or (type(loss_hex) is str and _HEX.fullmatch(loss_hex))):
            text = "null" if loss_hex is None else f'"{loss_hex}"'
            return f'{{"step": {step}, "epoch": {epoch}, "loss_hex": {text}, "lr": {"null" if lr is None else repr(lr)}}}'
    return json.dumps(record, default=_called)


_HEX = re.compile(r"-?(0x[0-9a-f.]+p[+-]\d+|nan|inf)")


def _called(value: Any) -> Any:
    """A value that stands for a later one (see the module's docstring), for json.dumps."""
    if callable(value):
        return value()
    raise TypeError(f"a trajectory value of type {type(value).__name__} is not JSON")
