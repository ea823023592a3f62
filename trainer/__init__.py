"""legato's exact-resume core: the public API for a DDP training loop.

    import trainer as legato

    legato.seed_everything(seed, rank)
    loader = legato.resumable_loader(dataset, batch_size, seed=seed, rank=rank, world_size=world)
    session = legato.Session(run_dir, model=ddp, optimizer=opt, loader=loader, total_steps=N)
    for batch in session:
        ...
        session.report(loss)
    sys.exit(session.exit_code)

This package never imports the orchestrator.
"""

from trainer.context import RunContext
from trainer.determinism import Seeds, derive_seed, seed_everything
from trainer.errors import EXIT_OK, EXIT_STOPPED, EXIT_USAGE, ResumeMismatchError, UsageError
from trainer.sampler import ResumableDistributedSampler, sample_generator
from trainer.session import Chaos, CheckpointPolicy, Session, StopPolicy, resumable_loader

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
