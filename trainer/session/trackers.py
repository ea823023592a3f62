"""Points on a dashboard exactly once per step, across stops, hard kills and a resume's replay.

    tracker = session.tracker(tensorboard="runs/exp")      # or wandb={"project": "exp"}, or both
    for batch in session:
        ...
        tracker.log({"train/loss": loss})                   # at session.step; skipped where it must be
    tracker.close()

A resumed attempt runs a few steps again to prove itself (the replay), and after a hard kill trains again the
steps the killed attempt logged past its checkpoint. `Tracker.log` writes a point only on rank 0, only for a step
this attempt trains for the first time (not a replayed one, nothing after the agreed stop), and opens its sinks
once the loop knows where it resumed: TensorBoard drops what a killed attempt logged from that step on
(`purge_step`), W&B continues the run under the run's id and leaves out the steps it already holds. The Session
flushes every tracker before each checkpoint, so a point of a step a checkpoint covers is on disk before the
checkpoint is, and no kill can lose it for good.

It must never log from a rank other than 0, nor import a tracker's package before a sink of that kind opens
(neither package is a dependency of legato).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from legato.errors import UsageError

log = logging.getLogger(__name__)

Number = Any  # a float, an int, or a one-element tensor (read with float())


class Loop(Protocol):
    """What a tracker reads of the Session's loop."""

    rank: int
    stopped: bool

    @property
    def replaying(self) -> bool: ...

    @property
    def step(self) -> int: ...

    @property
    def resumed_step(self) -> int: ...

    @property
    def run_id(self) -> str: ...

    @property
    def begun(self) -> bool: ...


class Sink(Protocol):
    """One dashboard: opened once where the attempt resumed, written a step's points at a time."""

    def open(self, resumed_step: int, run_id: str) -> None: ...

    def holds(self, step: int) -> bool:
        """True when the dashboard already holds `step` from an earlier attempt and cannot take it again."""
        ...

    def write(self, values: Mapping[str, float], step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """A `SummaryWriter` on `log_dir` that purges, from the step the attempt resumed, what a killed attempt logged."""

    def __init__(self, log_dir: str | Path, options: Mapping[str, Any]) -> None:
        if "purge_step" in options:
            raise UsageError(
                "session.tracker(tensorboard=...) sets the SummaryWriter's purge_step itself (to the step the attempt "
                "resumed from); remove purge_step from the writer's options."
            )
        self.log_dir, self.options = str(log_dir), dict(options)
        self._writer: Any = None

    def open(self, resumed_step: int, run_id: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # At step 0 too: a launch killed before its first checkpoint leaves points that the next one trains again.
        self._writer = SummaryWriter(self.log_dir, purge_step=resumed_step, **self.options)

    def holds(self, step: int) -> bool:
        return False  # the purge dropped every point from the resumed step on

    def write(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run continued under the legato run's id on every attempt.

    W&B refuses a step below the newest it holds and cannot replace points: after a hard kill the steps between the
    checkpoint and the newest point W&B kept are left as the killed attempt logged them (the same values, where the run
    is exact) and not logged again. W&B keeps its points in its own process and writes them on its own schedule (its
    offline `.wandb` file every 15 s by default): a kill loses what it had not written, and `flush` cannot force it.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        taken = sorted({"id", "resume", "resume_from", "fork_from"} & set(options))
        if taken:
            raise UsageError(
                f"session.tracker(wandb=...) continues the W&B run under the legato run's id on every attempt; remove "
                f"{', '.join(taken)} from its options (session.run_id is the id it uses)."
            )
        self.options = dict(options)
        self._run: Any = None
        self._held_below = 0

    def open(self, resumed_step: int, run_id: str) -> None:
        import wandb

        self._run = wandb.init(id=run_id, resume="allow", **self.options)
        self._held_below = int(self._run.step)
        if self._held_below > resumed_step:
            log.info("W&B holds steps up to %d from an earlier attempt; they are not logged again", self._held_below - 1)

    def holds(self, step: int) -> bool:
        return step < self._held_below

    def write(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def flush(self) -> None:
        return  # W&B's SDK has no flush: its own process writes on its schedule

    def close(self) -> None:
        self._run.finish()


class Tracker:
    """Rank 0's dashboards, written once per step whatever stops, kills and replays the run goes through."""

    def __init__(self, loop: Loop, sinks: list[Sink]) -> None:
        self._loop = loop
        self._sinks = sinks if loop.rank == 0 else []
        self._opened = False

    def log(self, values: Mapping[str, Number], step: int | None = None) -> bool:
        """Write `values` (tag to number) at `step` (the Session's step by default) to every dashboard, on rank 0, unless
        the step is replayed, comes after the agreed stop, or a dashboard already holds it. True when written anywhere.

        Call it inside the loop or after it (a validation after an epoch's batches, a final test), never before it:
        where the attempt resumed is known once the loop began.
        """
        if not self._sinks or self._loop.replaying or self._loop.stopped:
            return False
        if not self._loop.begun:
            raise UsageError(
                "tracker.log() was called before the Session's loop began: where this attempt resumed (the step a "
                "dashboard continues from) is known only then. Log inside `for batch in session:` or after it."
            )
        at = self._loop.step if step is None else step
        self._open()
        points = {tag: float(value.detach()) if isinstance(value, torch.Tensor) else float(value) for tag, value in values.items()}
        wrote = False
        for sink in self._sinks:
            if not sink.holds(at):
                sink.write(points, at)
                wrote = True
        return wrote

    def flush(self) -> None:
        """Put every point logged so far on disk (where the dashboard can): the Session calls it before each checkpoint."""
        if self._opened:
            for sink in self._sinks:
                sink.flush()

    def close(self) -> None:
        """Flush and close every dashboard (a W&B run is finished); log nothing after it."""
        if self._opened:
            for sink in self._sinks:
                sink.close()
        self._sinks, self._opened = [], False

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if self._opened:
            return
        for sink in self._sinks:
            sink.open(self._loop.resumed_step, self._loop.run_id)
        self._opened = True


def sinks_for(tensorboard: str | Path | None, tensorboard_options: Mapping[str, Any], wandb: Mapping[str, Any] | None) -> list[Sink]:
    """The sinks a `session.tracker(...)` call names; at least one."""
    sinks: list[Sink] = []
    if tensorboard is not None:
        sinks.append(TensorBoardSink(tensorboard, tensorboard_options))
    if wandb is not None:
        sinks.append(WandbSink(wandb))
    if not sinks:
        raise UsageError(
            "session.tracker() names no dashboard: pass tensorboard=LOG_DIR (a SummaryWriter's folder), "
            "wandb={...} (wandb.init's options, e.g. {'project': 'exp'}), or both."
        )
    return sinks
