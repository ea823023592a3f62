"""Exact data position: a resumable distributed sampler and worker seeding.

The sampler's whole state is (seed, epoch, position within this rank's share
of the epoch). Its order is a pure function of (seed, epoch), so it resumes in
the middle of an epoch without touching the samples it skips. Per-sample
randomness (augmentations) comes from `sample_generator(seed, epoch, index)`,
which depends neither on the worker count nor on where a run was cut. Nothing
here may read the global RNGs.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from legato.config_build import whole_number
from legato.errors import UsageError
from legato.state.determinism import derive_seed
from legato.voice import refusing


class ResumableDistributedSampler(Sampler[int]):
    """Shuffles `length` indices per epoch and yields this rank's share from `position` on."""

    def __init__(self, length: int, rank: int, world_size: int, seed: int, shuffle: bool = True) -> None:
        if length < world_size:
            raise ValueError(f"dataset of {length} samples cannot be split over {world_size} ranks")
        self.length = length
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self.per_rank = length // world_size

    def set_position(self, epoch: int, position: int) -> None:
        """Next iteration yields sample `position` of this rank's share of `epoch`."""
        if not 0 <= position <= self.per_rank:
            raise ValueError(f"position {position} outside 0..{self.per_rank}")
        self.epoch = epoch
        self.position = position

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.set_position(state["epoch"], state["position"])

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's indices for `epoch`, in order (drops the tail that does not split evenly)."""
        if self.shuffle:
            gen = torch.Generator().manual_seed(derive_seed("order", self.seed, epoch))
            order = torch.randperm(self.length, generator=gen)
        else:
            order = torch.arange(self.length)
        return order[: self.per_rank * self.world_size][self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_order(self.epoch)[self.position :].tolist())

    def __len__(self) -> int:
        return self.per_rank - self.position


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator owned by one sample of one epoch: the source of its augmentation randomness."""
    return torch.Generator().manual_seed(derive_seed("sample", seed, epoch, index))


def worker_init(worker_id: int) -> None:
    """DataLoader worker setup: die with the rank, ignore stop signals, seed python and numpy from torch's worker seed."""
    import multiprocessing
    import random

    import numpy as np

    from legato.system.lifeline import die_with_parent

    rank_process = multiprocessing.parent_process()
    die_with_parent(rank_process.pid if rank_process else None)

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    seed = torch.initial_seed()
    random.seed(seed)
    np.random.seed(seed % 2**32)


_SET_BY_RESUMABLE_LOADER = frozenset({"sampler", "batch_sampler", "drop_last", "worker_init_fn", "generator", "persistent_workers"})


@refusing
def resumable_loader(
    dataset: Any,
    batch_size: int,
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    shuffle: bool = True,
    **kwargs: Any,
) -> DataLoader:
    """A DataLoader whose position the Session can save and restore exactly; `kwargs` go to the DataLoader, except what it sets itself."""
    fixed = sorted(kwargs.keys() & _SET_BY_RESUMABLE_LOADER)
    if fixed:
        raise UsageError(
            f"legato.resumable_loader() sets {', '.join(fixed)} itself: its sampler, generator and worker setup make the "
            "order and the workers' seeds a function of (seed, epoch). Leave them out, or build your own torch DataLoader "
            "and pass it as Session(loader=...), which also resumes with persistent_workers=True."
        )
    _check_loader_arguments(dataset, batch_size, seed, rank, world_size)
    sampler = ResumableDistributedSampler(len(dataset), rank, world_size, seed, shuffle=shuffle)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        worker_init_fn=worker_init if num_workers else None,
        generator=torch.Generator(),
        persistent_workers=False,
        **kwargs,
    )


def _check_loader_arguments(dataset: Any, batch_size: Any, seed: Any, rank: Any, world_size: Any) -> None:
    """A UsageError naming the first argument resumable_loader() cannot build an exactly resumable loader from."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise UsageError(
            f"legato.resumable_loader() takes a map-style dataset (len() and indexing), which this "
            f"{type(dataset).__name__} is not. For an IterableDataset or a stream, build your own DataLoader and "
            "pass it as Session(loader=...)."
        )
    counts = {"batch_size": (batch_size, 1), "world_size": (world_size, 1), "rank": (rank, 0)}
    for name, (value, least) in counts.items():
        if whole_number(value) is None or value < least:
            raise UsageError(f"legato.resumable_loader(): {name}={value!r} must be a whole number of at least {least}.")
    if whole_number(seed) is None:
        raise UsageError(f"legato.resumable_loader(): seed={seed!r} must be a whole number; the order is a function of (seed, epoch).")
    if rank >= world_size:
        raise UsageError(
            f"legato.resumable_loader(): rank={rank} is not one of the {world_size} ranks (0 to {world_size - 1}). Pass "
            "this process's rank and the world size, such as dist.get_rank() and dist.get_world_size()."
        )
    if len(dataset) < world_size:
        raise UsageError(
            f"legato.resumable_loader(): the dataset's {len(dataset)} samples cannot be split over {world_size} ranks. "
            "Use a larger dataset or fewer ranks."
        )
