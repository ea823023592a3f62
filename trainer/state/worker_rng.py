"""Worker randomness made exact: per-sample seeding of the global RNGs inside DataLoader workers.

torchvision-style transforms draw from the global python, numpy and torch
RNGs. In a worker those streams start at `base_seed + worker_id` and advance
with every sample the worker happened to load, so after a mid-epoch resume
(or with another worker count) a sample gets other random numbers. Here each
worker's copy of the dataset gets a `__getitem__` that first seeds all three
from (seed, epoch, index): a sample's randomness then depends on nothing but
which sample of which epoch it is. The user's own `worker_init_fn` still runs,
after this setup. The epoch lives in memory shared with the workers, because
persistent workers (`persistent_workers=True`) load many epochs. This must
never touch the main process's RNGs: everything here runs inside the workers.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from legato.state.determinism import derive_seed
from legato.system.processes import parent_of


def seed_globals(seed: int, epoch: int, key: Any) -> None:
    """Seed python, numpy and torch global RNGs for one sample (or one batched fetch)."""
    s = derive_seed("sample", seed, epoch, key)
    random.seed(s)
    np.random.seed(s % 2**32)
    # The CPU generator only: `torch.manual_seed` also queues lazy seeding of every device type and records a
    # stack trace each call (~100x the cost), and a DataLoader worker draws from the CPU generator alone.
    torch.default_generator.manual_seed(s)


class SeedPerSample:
    """A DataLoader `worker_init_fn`: per-sample seeding of the worker's dataset copy, then the user's own function."""

    def __init__(self, seed: int, user_fn: Callable[[int], None] | None) -> None:
        self.seed = seed
        self.rank_pid = os.getpid()  # built in the rank; workers get a copy, whatever their start method
        # Shared, not copied into the workers: persistent workers see the epoch change under them.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.user_fn = user_fn

    @property
    def epoch(self) -> int:
        """The epoch whose samples the workers load; set before each epoch's iterator asks them for a sample."""
        return int(self._epoch)

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch.fill_(value)

    def __call__(self, worker_id: int) -> None:
        from legato.system.lifeline import die_with_parent, die_with_process

        parent = _expected_parent(self.rank_pid)
        die_with_parent(parent)
        if parent != self.rank_pid:
            die_with_process(self.rank_pid)
        # Stop signals are for the rank; the rank agrees a stop with the others and ends its workers.
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        info = torch.utils.data.get_worker_info()
        # An IterableDataset's samples have no index: its randomness is its own (saved by its state_dict), not per sample.
        if info is not None and not isinstance(info.dataset, torch.utils.data.IterableDataset):
            _reseeding(info.dataset, self.seed, self._epoch.numpy())
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _expected_parent(rank_pid: int) -> int:
    """The parent this worker's death signal is armed for: the rank itself (fork, spawn), or, for `forkserver`, the
    fork server the rank started. That one outlives the rank while any worker holds its pipe, so a forkserver
    worker also watches the rank itself (`__call__`)."""
    parent = os.getppid()
    if parent != rank_pid and parent_of(parent) == rank_pid:
        return parent
    return rank_pid


def _reseeding(dataset: Any, seed: int, epoch: np.ndarray) -> None:
    """Swap this worker's dataset copy to a subclass that seeds before every sample it loads, from the epoch `epoch` holds
    as it loads it (a view of the rank's shared cell)."""
    base = type(dataset)
    namespace: dict[str, Any] = {"__module__": base.__module__, "__qualname__": base.__qualname__}

    def __getitem__(self: Any, index: Any) -> Any:
        seed_globals(seed, int(epoch), index)
        return base.__getitem__(self, index)

    namespace["__getitem__"] = __getitem__
    if hasattr(base, "__getitems__"):

        def __getitems__(self: Any, indices: list) -> Any:
            # A batched fetch: one seed for the whole call, from its first index.
            seed_globals(seed, int(epoch), ("batch", indices[0] if indices else None))
            return base.__getitems__(self, indices)

        namespace["__getitems__"] = __getitems__
    dataset.__class__ = type(base.__name__, (base,), namespace)
