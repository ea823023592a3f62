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

from legato.errors import EXIT_OK, EXIT_STOPPED, EXIT_USAGE, ResumeMismatchError, UsageError

_LAZY = {
    "RunContext": "legato.context",
    "Seeds": "legato.determinism",
    "derive_seed": "legato.determinism",
    "seed_everything": "legato.determinism",
    "ResumableDistributedSampler": "legato.sampler",
    "sample_generator": "legato.sampler",
    "Chaos": "legato.session",
    "CheckpointPolicy": "legato.session",
    "Session": "legato.session",
    "StopPolicy": "legato.session",
    "resumable_loader": "legato.session",
}

__all__ = [
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "Chaos",
    "CheckpointPolicy",
    "ResumableDistributedSampler",
    "ResumeMismatchError",
    "RunContext",
    "Seeds",
    "Session",
    "StopPolicy",
    "UsageError",
    "derive_seed",
    "resumable_loader",
    "sample_generator",
    "seed_everything",
]

if TYPE_CHECKING:
    from legato.context import RunContext
    from legato.determinism import Seeds, derive_seed, seed_everything
    from legato.sampler import ResumableDistributedSampler, sample_generator
    from legato.session import Chaos, CheckpointPolicy, Session, StopPolicy, resumable_loader


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'legato' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
