"""What a Session is told to do about checkpoints and stop signals: plain, frozen settings with their defaults.

The defaults are the product's promises (a periodic checkpoint on by default, a replay-verified resume); each is
justified where it is set. Each setting is held, as it is made, to the bounds the config's `checkpoint.*` key has
(legato.config), so `CheckpointPolicy(keep_last=0)` is refused in one paragraph before anything is written, as
`checkpoint.keep_last: 0` is. This module must never act on a setting: the Session and its delegates do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from legato.config import CheckpointSection
from legato.config_build import check_values
from legato.errors import UsageError
from legato.system.signals import normalize_signal
from legato.voice import refusing

__all__ = ["CheckpointPolicy", "StopPolicy"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """When to checkpoint, how many to keep, and how a resume is verified."""

    every_steps: int = 0
    # On by default, so a hard kill (node failure, OOM, SIGKILL at the time limit) loses at most this much work. Young-Daly:
    # sqrt(2 x checkpoint cost x mean time between failures) = sqrt(2 x 2.6 s x 1 day) ~ 11 min for 256 MiB at defaults
    # (2026-11-23, 2 cores); 10 minutes costs under 0.5% of the run. 0 turns it off.
    every_minutes: float = 10.0
    keep_last: int = 3
    verify: str = "error"  # "error" or "warn" on a resume whose state hash does not match
    hash_every_steps: int = 10
    agree_every_steps: int = 0  # 0: agree about once a second, whatever the step time
    # K: keep a replay base at most K steps back and replay it on resume; 0 for off (default: see docs/benchmarks.md)
    replay_steps: int = 32
    # Periodic checkpoints written in the background (legato.store.async_checkpoint). None: on when the model lives on a
    # GPU, where the device-to-pinned-host copy blocks about 0.01x a synchronous write (docs/gpu.md), off on the CPU,
    # where the two measured a tie end to end (docs/benchmarks.md) and the copy would only cost host memory.
    async_: bool | None = None
    # Resume a checkpoint written by another world size, resharded (FSDP2 only; docs/fsdp2.md): data position exact, not bitwise.
    reshard: bool = False
    # A replay base also at most this many seconds back (whichever bound comes first), so that a resume replays a bounded
    # time whatever the step time: 32 steps of 5 s were 160 s of replay, a quarter of the 10-minute interval. None: a tenth
    # of the periodic interval (60 s at every_minutes=10), 60 s when every_minutes is 0; 0: the steps bound alone. Each new
    # base costs a memory copy of the state (docs/exactness.md); legato.session.base_clock decides when.
    replay_seconds: float | None = None

    @refusing
    def __post_init__(self) -> None:
        check_values(CheckpointSection, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "CheckpointPolicy")


@dataclass(frozen=True)
class StopPolicy:
    """The signals that ask the run to stop at an agreed step."""

    signals: tuple[str, ...] = ("USR2",)

    @refusing
    def __post_init__(self) -> None:
        if isinstance(self.signals, str) or not isinstance(self.signals, (tuple, list)) or not self.signals:
            raise UsageError(f"StopPolicy: signals is {self.signals!r}, but it must be a tuple of one or more signal names. "
                             "Write StopPolicy(signals=(\"USR2\",)), or (\"USR2\", \"TERM\") for two.")
        for name in self.signals:
            normalize_signal(name, key="StopPolicy: a name in signals")
