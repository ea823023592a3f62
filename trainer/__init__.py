"""legato: exact-resume training for PyTorch DDP, and the public API for your own loop.

    import legato

    legato.seed_everything(seed, rank)
    loader = legato.resumable_loader(dataset, batch_size, seed=seed, rank=rank, world_size=world)
    session = legato.Session(run_dir, model=ddp, optimizer=opt, loader=loader, total_steps=N)
    for batch in session:
        ...
        session.report(loss)
    sys.exit(session.exit_code)

The names below load on first use, so `import legato.errors` and the
`legato` command line do not import torch. The core (this folder) never
imports `legato.orchestrator` or `legato.slurm`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from legato.errors import EXIT_HUNG, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, ResumeMismatchError, UsageError

_LAZY = {
    "RunContext": "legato.runtime.context",
    "Seeds": "legato.state.determinism",
    "derive_seed": "legato.state.determinism",
    "seed_everything": "legato.state.determinism",
    "ResumableDistributedSampler": "legato.state.sampler",
    "attributes": "legato.state.plain",
    "sample_generator": "legato.state.sampler",
    "Chaos": "legato.session.session",
    "CheckpointPolicy": "legato.session.policy",
    "HangPolicy": "legato.session.policy",
    "Session": "legato.session.session",
    "StopPolicy": "legato.session.policy",
    "Tracker": "legato.session.trackers",
    "resumable_loader": "legato.state.sampler",
}

__all__ = [
    "EXIT_HUNG",
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "Chaos",
    "CheckpointPolicy",
    "HangPolicy",
    "ResumableDistributedSampler",
    "ResumeMismatchError",
    "RunContext",
    "Seeds",
    "Session",
    "StopPolicy",
    "Tracker",
    "UsageError",
    "attributes",
    "derive_seed",
    "resumable_loader",
    "sample_generator",
    "seed_everything",
]

if TYPE_CHECKING:
    from legato.runtime.context import RunContext
    from legato.session.session import Chaos, CheckpointPolicy, HangPolicy, Session, StopPolicy, resumable_loader
    from legato.session.trackers import Tracker
    from legato.state.determinism import Seeds, derive_seed, seed_everything
    from legato.state.plain import attributes
    from legato.state.sampler import ResumableDistributedSampler, sample_generator


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'legato' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
