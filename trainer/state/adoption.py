"""Which loaders legato can resume exactly: `adopt(loader)` turns what a user hands the Session into a data source
(legato.state.loaders), or refuses it with a UsageError naming the fix, before any training.

Accepted: `resumable_loader()` loaders; a torch `DataLoader` (torchdata's
`StatefulDataLoader` included) over a map-style dataset, with `sampler=` (or
`shuffle=`) and `batch_size=`, whose sampler orders an epoch by `set_epoch` or
by the RNG it draws as the epoch opens; anything else with
`state_dict`/`load_state_dict`. Refused: loaders with neither, `in_order=False`
(timing decides the order), an `IterableDataset` whose position only its
workers hold, batch samplers legato cannot position, samplers with no
`set_epoch` that are none of torch's, and persistent workers wherever a
resumed run would start them differently from the uninterrupted one. This
module must never change a loader it refuses, and never draw from an RNG.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from legato.errors import UsageError
from legato.state.loaders import LegatoSource, Source, StatefulSource, TorchSource, user_sampler
from legato.state.sampler import ResumableDistributedSampler

# Samplers whose order is decided by the RNG they draw as an epoch's iteration starts.
_RNG_ORDERED = (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _stateful(obj: Any) -> bool:
    """Whether `obj` saves and restores its own state (state_dict() and load_state_dict())."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def adopt(loader: Any, worker_rng: bool = True) -> Source | None:
    """The data source for `loader` (None: the loop draws its own batches); a UsageError naming the fix when it cannot resume exactly."""
    if loader is None:
        return None
    if not isinstance(loader, DataLoader):
        if _stateful(loader) and callable(getattr(loader, "__iter__", None)):
            return StatefulSource(loader, loader)
        raise UsageError(
            f"The loader is a {type(loader).__name__}, which legato cannot resume: it is not a torch DataLoader and has no "
            "state_dict()/load_state_dict(). Pass a torch DataLoader, give your loader both methods (torchdata's "
            "StatefulDataLoader has them), or pass no loader and draw batches in the loop, registering any batch "
            "you keep between steps with session.carry()."
        )
    if loader.num_workers > 0 and not getattr(loader, "in_order", True):
        raise UsageError(
            "The DataLoader has in_order=False: its workers hand over batches as they finish them, so which batch comes at "
            "which step depends on timing, and no run, interrupted or not, can be repeated or its resume proved. Set "
            "in_order=True (the default); the workers still load ahead."
        )
    if isinstance(loader.sampler, ResumableDistributedSampler):
        _refuse_persistent(loader, "has legato.resumable_loader()'s sampler")
        return LegatoSource(loader)
    if isinstance(loader.dataset, IterableDataset):
        _refuse_persistent(loader, f"reads an IterableDataset ({type(loader.dataset).__name__})")
        return _iterable(loader, worker_rng)
    # A loader given batch_sampler= (torch's BatchSampler too) has no batch_size.
    if _stateful(loader) and (not isinstance(loader.batch_sampler, BatchSampler) or loader.batch_size is None):
        _refuse_persistent(loader, "has its own batch sampler")
        return StatefulSource(loader, loader, worker_rng)
    return _map_style(loader, worker_rng)


def _refuse_persistent(loader: DataLoader, what: str) -> None:
    if loader.persistent_workers and loader.num_workers > 0:
        raise UsageError(
            f"The DataLoader has persistent_workers=True, and it {what}. Persistent workers live from one epoch into the "
            "next, and legato restarts them exactly only for torch's own DataLoader over a map-style dataset with sampler= "
            "(or shuffle=) and batch_size=; with this loader a run resumed in a later epoch would load differently from "
            "the uninterrupted run. Set persistent_workers=False, or use such a loader."
        )


def _iterable(loader: DataLoader, worker_rng: bool) -> Source:
    dataset = loader.dataset
    if _stateful(loader):
        # torchdata's StatefulDataLoader: it snapshots each worker's dataset state itself.
        return StatefulSource(loader, loader, worker_rng)
    if _stateful(dataset) and loader.num_workers == 0:
        return StatefulSource(loader, dataset)
    why = (
        "has no state_dict()/load_state_dict()"
        if not _stateful(dataset)
        else f"is read by {loader.num_workers} workers, whose copies hold the position"
    )
    raise UsageError(
        f"The DataLoader reads an IterableDataset ({type(dataset).__name__}) that {why}, so legato cannot know which sample "
        "comes next after a resume. Give the dataset state_dict()/load_state_dict() and use num_workers=0, or use "
        "torchdata's StatefulDataLoader, or a map-style dataset with a sampler."
    )


def _rng_ordered(sampler: Any) -> bool:
    """Whether the sampler's order is decided by the generators it draws as its iteration starts (torch's, torchdata's)."""
    if type(sampler) in _RNG_ORDERED:
        return True
    # torchdata's RandomSampler draws its permutation from its own generator (recorded as SAMPLER_GENERATOR) in iter().
    return type(sampler).__module__ == "torchdata.stateful_dataloader.sampler" and type(sampler).__name__ == "RandomSampler"


def _map_style(loader: DataLoader, worker_rng: bool) -> Source:
    batches = loader.batch_sampler
    if not isinstance(batches, BatchSampler) or loader.batch_size is None:
        what = "batch_size=None (no batching)" if batches is None else f"its own batch_sampler ({type(batches).__name__})"
        raise UsageError(
            f"The DataLoader uses {what}, which legato cannot position in the middle of an epoch. Pass sampler= and "
            "batch_size= instead, or give the loader state_dict()/load_state_dict() (torchdata's StatefulDataLoader)."
        )
    if _stateful(loader):
        # torchdata's StatefulDataLoader starts a persistent iterator's sampler twice as it opens its first epoch.
        _refuse_persistent(loader, f"is a {type(loader).__name__}")
    if callable(getattr(loader.dataset, "set_epoch", None)):
        # Persistent workers keep the dataset copy of the epoch that started them; a resumed run's would copy a later one.
        _refuse_persistent(
            loader,
            f"reads a dataset with set_epoch() ({type(loader.dataset).__name__}), which never reaches "
            "persistent workers: they keep the copy they started with",
        )
    sampler = user_sampler(batches)
    if not (callable(getattr(sampler, "set_epoch", None)) or _rng_ordered(sampler)):
        raise UsageError(
            f"The DataLoader's sampler ({type(sampler).__name__}) has no set_epoch(epoch) and is none of torch's own samplers, "
            "so legato cannot replay its order after a resume. Give it a set_epoch(epoch) method after which its order is a "
            "function of the epoch (as torch's DistributedSampler), or use torch's DistributedSampler or RandomSampler."
        )
    return TorchSource(loader, worker_rng)
