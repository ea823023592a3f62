"""Each rank's own pace: how long its steps wait for data and how long its model's forward computes, for naming a slow
rank or host.

Under DDP every rank's step takes as long as the slowest rank's (the gradients' all-reduce waits for it), so step
times cannot name a straggler. What differs is where each rank's time goes before it reaches a collective: the wait
for its batch (from the end of one step to the yield of the next) and its model's forward pass, timed between a
forward pre-hook and a forward hook on the module inside the DDP wrapper (after DDP's own buffer broadcast, which waits
for the others). The hooks are on the module only for the steps whose forward is timed, at most one every SAMPLE_S
(every step of a loop whose steps are longer): a module with hooks takes torch's slower call path, a few µs a call,
which a loop of sub-millisecond steps would otherwise pay at every step. Every WINDOW_S seconds of steps, and at the
attempt's end, the rank appends the medians of its window to its own file (`RunPaths.pace`): no collective, nothing
per step but a few clock readings. `legato status` compares the ranks (legato.orchestrator.stragglers).

Only an eager model on the CPU has its forward timed: on a GPU the forward pass on the host only queues kernels (its
timing needs device events: not measured here yet); a forward that runs collectives itself (an FSDP2 model's
all-gathers) waits for its peers inside; and a hook on a module torch.compile traces would break its graph (the
Session passes no module for those, and their data wait alone is compared). This module must never start a
collective, touch the training state or raise out of a hook.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

WINDOW_S = 5.0
SAMPLE_S = 0.05  # a step's forward is timed if this long has passed since the last timed one's batch


class Pace:
    """One rank's data waits and forward times, written out a window at a time."""

    def __init__(self, path: Path, module: torch.nn.Module | None, rank: int) -> None:
        """`module`: the model whose forward is timed (None: none is; see the module's docstring for which)."""
        self.path, self.rank = path, rank
        self._data: list[float] = []
        self._forward: list[float] = []
        self._steps: list[float] = []
        self._window_start = self._step_end = time.perf_counter()
        self._forward_start: float | None = None
        self._armed = False  # the loop holds a batch it has not run forward yet: a validation's forwards are not timed
        self._module = module if module is not None and not any(p.is_cuda for p in module.parameters()) else None
        self._sampled_at = float("-inf")
        self._hooks: list[Any] = []
        self._unwritable = False

    def _before(self, *args: Any) -> None:
        if self._armed:
            self._forward_start = time.perf_counter()

    def _after(self, *args: Any) -> None:
        if self._forward_start is not None:
            self._forward.append(time.perf_counter() - self._forward_start)
            self._forward_start, self._armed = None, False

    def yielded(self) -> None:
        """The loop gets its batch now: the time since the last step ended was its wait for data; this step's forward is
        timed when the last timed one is SAMPLE_S old."""
        now = time.perf_counter()
        self._data.append(now - self._step_end)
        if self._module is not None and now - self._sampled_at >= SAMPLE_S:
            self._sampled_at, self._armed = now, True
            self._hooks = [self._module.register_forward_pre_hook(self._before), self._module.register_forward_hook(self._after)]

    def stepped(self, step: int) -> None:
        """Step `step` ended; a window that lasted WINDOW_S is written out."""
        now = time.perf_counter()
        if self._hooks:
            self._unhook()
        self._steps.append(now - self._step_end)
        self._step_end = now
        if now - self._window_start >= WINDOW_S:
            self._write(step, now)

    def close(self, step: int) -> None:
        """The attempt's end: write what is left and take the hooks off the model."""
        self._unhook()
        if self._steps:
            self._write(step, time.perf_counter())

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._armed, self._forward_start = [], False, None

    def _write(self, step: int, now: float) -> None:
        line = {
            "step": step,
            "steps": len(self._steps),
            "seconds": round(now - self._window_start, 3),
            "host": socket.gethostname(),
            "step_ms": _median_ms(self._steps),
            "data_ms": _median_ms(self._data),
            "forward_ms": _median_ms(self._forward) if self._module is not None else None,
        }
        self._data, self._forward, self._steps, self._window_start = [], [], [], now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as exc:  # the pace is a diagnosis: a full disk must not end the training
            if not self._unwritable:
                log.warning("rank %d: %s not written: %s", self.rank, self.path, exc)
            self._unwritable = True


def _median_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 3) if values else None
