"""What a training entrypoint receives on each rank: settings, identity, and session factories.

A user entrypoint `pkg.mod:fn` is called as `fn(ctx)` on every rank after the
process group is up and the seeds are set; it returns an exit code (or None
for 0). The built-in loop is such an entrypoint too. This module only wires
config values into the public API; it holds no training logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from legato.config import Config, training_settings
from legato.dist.stop import stop_signals
from legato.session.session import Chaos, CheckpointPolicy, HangPolicy, Session, StopPolicy, resumable_loader
from legato.state.determinism import Seeds
from legato.store import checkpoint as ckpt


@dataclass
class RunContext:
    """What one rank's training entrypoint is given: the config, its place in the world, device, seeds and event callback."""

    cfg: Config
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    seeds: Seeds
    on_event: Callable[[dict], None] = field(default=lambda event: None)
    amp_dtype: torch.dtype = torch.bfloat16  # autocast dtype with train.amp (legato.runtime.devices decides it)

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    @property
    def options(self) -> dict:
        return self.cfg.train.options

    def loader(self, dataset: Any, batch_size: int | None = None, **kwargs: Any) -> DataLoader:
        return resumable_loader(
            dataset,
            batch_size or self.cfg.train.batch_size,
            seed=self.cfg.determinism.seed,
            rank=self.rank,
            world_size=self.world_size,
            num_workers=self.cfg.train.num_workers,
            **kwargs,
        )

    def session(self, **kwargs: Any) -> Session:
        """A Session with checkpoint, stop, hang and chaos policies from the config; kwargs as for Session."""
        chaos = self.cfg.chaos
        kwargs.setdefault("total_steps", self.cfg.train.steps)
        # Strict determinism also refuses state legato does not save (legato.state.census).
        kwargs.setdefault("census", "strict" if self.cfg.determinism.mode == "strict" else "warn")
        return Session(
            self.run_dir,
            checkpoint=CheckpointPolicy.from_section(self.cfg.checkpoint),
            stop=StopPolicy(stop_signals(self.cfg.slurm.signal, self.cfg.slurm.handle_sigterm)),
            hang=HangPolicy.from_section(self.cfg.hang),
            chaos=Chaos(
                signal_rank=chaos.signal_rank,
                signal_at_steps=tuple(chaos.signal_at_steps),
                skip_restore=frozenset(chaos.skip_restore),
                kill=ckpt.KillPoint(chaos.kill_in_checkpoint, chaos.kill_point) if chaos.kill_in_checkpoint else None,
                consume_rng_after_restore=tuple(chaos.consume_rng_after_restore),
                step_sleep_s=chaos.step_sleep_s,
            ),
            training=training_settings(self.cfg),
            on_event=self.on_event,
            **kwargs,
        )
