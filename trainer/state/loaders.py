"""The user's own data pipeline, made resumable at any batch without changing its order.

legato.state.adoption decides which loaders are accepted and wraps each in
one of these sources (or refuses it before training). A source opens an
epoch's iterator at a position, and its `state_dict` says where the next
batch comes from:

- `resumable_loader()` loaders (legato's own sampler): as before.
- a torch `DataLoader` (torchdata's `StatefulDataLoader` included) over a
  map-style dataset with a `BatchSampler` over a sampler whose order is a
  function of its epoch (anything with `set_epoch`, such as torch's
  `DistributedSampler`) or of the RNG it draws when an epoch starts
  (`RandomSampler`, torchdata's `RandomSampler`, ...). Its order is left
  alone: legato calls `set_epoch` on nothing of the user's; the loop calls it
  where the plain loop did, and a resume puts back the epoch the sampler had
  when the interrupted epoch opened. The global torch RNG and the loader's
  generators are recorded when an epoch's iterator is opened, because opening
  draws from them (the workers' base seed, `RandomSampler`'s seed); a
  mid-epoch resume replays that opening from the recorded state and skips the
  consumed batches by their indices, never loading their samples. With
  workers, their global RNGs are seeded per sample (legato.state.worker_rng)
  unless the Session's `worker_rng` is False.
  This position, not a `StatefulDataLoader`'s own `state_dict`, is what is
  saved for such a loader: the loader's own state counts the consumed
  batches and fast-forwards a sampler that is not itself stateful over a
  fresh `iter(sampler)`; it does not hold the seed torch's `RandomSampler`
  drew from the global RNG as the epoch opened, so its resume draws another
  permutation. legato's replayed opening is exact with every accepted
  sampler (tests/unit/test_byo_loader.py shows both), and one rule then
  covers torch's and torchdata's loaders alike.
- anything else with `state_dict`/`load_state_dict` (a `StatefulDataLoader`
  over an `IterableDataset`, with or without workers, a user loader, a
  `DataLoader` over an `IterableDataset` with state and no workers): its own
  state is saved; only it knows where each worker's stream stands.

Persistent workers (`persistent_workers=True`) are kept for torch's own
`DataLoader` over a map-style dataset: the plain loop starts them once, drawing
their base seed as the first epoch opens, and later epochs draw only the
sampler's seed. A resumed process starts its workers from the RNG states of
that first opening, loading nothing, before it replays its own epoch's opening
(`TorchSource._start_workers`); other loaders with persistent workers are
refused (legato.state.adoption). This module must never draw from an RNG except
inside the `iter(loader)` calls the plain loop makes too, and then only from
the states that loop saw.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from legato.errors import UsageError
from legato.state.determinism import derive_seed
from legato.state.sampler import ResumableDistributedSampler
from legato.state.worker_rng import SeedPerSample

LOADER_GENERATOR = "loader"
SAMPLER_GENERATOR = "sampler"
SAMPLES_KEY = "samples"  # the dataset's length, in the data position of a source over a map-style dataset


def dataset_size(dataset: Any) -> int | None:
    """The number of samples of a map-style dataset, None where it has no length (a sampler may index one without)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def same_samples(state: dict, samples: int | None) -> None:
    """A UsageError when the checkpoint's data position was saved over a dataset of another size (a checkpoint of an older
    legato does not say, and passes): an epoch's order is drawn over every sample, so the run would go on with other
    batches than the one that wrote it, and with the replay off nothing else would notice."""
    saved = state.get(SAMPLES_KEY)
    if saved is None or samples is None or saved == samples:
        return
    raise UsageError(
        f"The checkpoint's data position was saved over a dataset of {saved} samples; this run's dataset has {samples}. Each "
        "epoch's order is drawn over all samples, so this run would train on other batches than the run that wrote the "
        f"checkpoint. Resume with the dataset of {saved} samples, or start training on the new data in a new run directory."
    )


def _set_epoch(obj: Any, epoch: int) -> None:
    set_epoch = getattr(obj, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


class Source:
    """Where batches come from; the Session keeps (epoch, step_in_epoch) and asks the source to open there."""

    steps_per_epoch: int | None = None  # None: an epoch ends when its iterator does
    keeps_workers = False  # whether the loader keeps its workers from one epoch to the next (persistent_workers=True)
    generators: dict[str, torch.Generator]

    @property
    def batches_per_epoch(self) -> int | None:
        """Batches in an epoch where known (what `total_epochs=` multiplies), also where the iterator ends the epoch."""
        return self.steps_per_epoch

    def open(self, epoch: int, step_in_epoch: int, resuming: bool) -> Iterator[Any]:
        raise NotImplementedError

    def state_dict(self, epoch: int, step_in_epoch: int) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        raise NotImplementedError

    def close(self) -> None:
        """The Session ends: shut down workers the loader keeps between epochs (none unless `keeps_workers`)."""


class LegatoSource(Source):
    """A `resumable_loader()`: reseeds its generator per epoch and positions its sampler."""

    def __init__(self, loader: DataLoader) -> None:
        sampler = loader.sampler
        assert isinstance(sampler, ResumableDistributedSampler)
        if loader.generator is None or not loader.drop_last:
            raise UsageError(
                "The loader has legato's ResumableDistributedSampler but no generator= or drop_last=False. "
                "Build it with legato.resumable_loader(), or pass your own DataLoader with torch's DistributedSampler."
            )
        assert loader.batch_size is not None  # torch refuses drop_last=True without batch_size=
        self.loader, self.sampler, self.batch_size = loader, sampler, loader.batch_size
        self.generators = {LOADER_GENERATOR: loader.generator}
        self.steps_per_epoch = sampler.per_rank // self.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"batch size {self.batch_size} is larger than a rank's share of the data ({sampler.per_rank})")

    def open(self, epoch: int, step_in_epoch: int, resuming: bool) -> Iterator[Any]:
        # Reseeding per epoch makes the workers' base seed a function of (seed, rank, epoch),
        # not of how many iterators this process happened to create before.
        self.loader.generator.manual_seed(derive_seed("loader", self.sampler.seed, self.sampler.rank, epoch))
        _set_epoch(self.loader.dataset, epoch)
        self.sampler.set_position(epoch, step_in_epoch * self.batch_size)
        return iter(self.loader)

    def state_dict(self, epoch: int, step_in_epoch: int) -> dict:
        return {
            "seed": self.sampler.seed,
            "epoch": epoch,
            "position": step_in_epoch * self.batch_size,
            SAMPLES_KEY: self.sampler.length,
        }

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        same_samples(state, self.sampler.length)
        if state["position"] % self.batch_size:
            raise UsageError(
                f"The checkpoint's data position is sample {state['position']} of this rank's share, not a whole number of batches "
                f"of {self.batch_size}: the global batch (per-rank batch x ranks) differs from the run that wrote it. Keep it."
            )
        self.sampler.load_state_dict(state)
        return state["epoch"], state["position"] // self.batch_size


class _Skipping:
    """One iteration of the user's sampler, started lazily: it draws its RNG and skips the consumed indices at its first next."""

    def __init__(self, owner: _Positioned) -> None:
        self.owner = owner
        self.indices: Iterator[int] | None = None

    def start(self) -> None:
        """Start the sampler's iteration now, taking over the owner's skip; once."""
        if self.indices is not None:
            return
        self.indices = iter(self.owner.sampler)
        skip, self.owner.skip = self.owner.skip, 0
        if skip:
            next(itertools.islice(self.indices, skip - 1, None), None)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self.start()
        assert self.indices is not None  # start() made it
        return next(self.indices)


class _Positioned:
    """Stands in for the user's sampler inside the loader's BatchSampler: the same indices, from a position on.

    Loaders call `iter()` on it eagerly (torchdata's BatchSampler, once per iterator and again in a multi-worker reset)
    or lazily (torch's, at the first batch); only the iteration that is started draws and skips, as in the plain loop.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.skip = 0
        self._last: _Skipping | None = None
        self._started: _Skipping | None = None
        self._hollow = False

    def at(self, skip: int) -> None:
        """The next epoch's iteration starts after `skip` indices."""
        self.skip, self._last, self._started = skip, None, None

    def prime(self) -> None:
        """Start the sampler's iteration now (it draws its RNG as it starts), unless the loader already did."""
        if self._last is None:
            self._started = _Skipping(self)
            self._started.start()
        else:
            self._last.start()

    @contextlib.contextmanager
    def hollow(self) -> Iterator[None]:
        """Iterations started inside yield no index and draw nothing: an iterator that only starts its workers."""
        self._hollow = True
        try:
            yield
        finally:
            self._hollow = False

    def __iter__(self) -> Iterator[int]:
        if self._hollow:
            return iter(())
        started, self._started = self._started, None
        self._last = started if started is not None else _Skipping(self)
        return self._last

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        # Code that reaches the sampler through loader.batch_sampler.sampler (set_epoch, seed) still finds it.
        if name == "sampler":
            raise AttributeError(name)
        return getattr(self.sampler, name)


class TorchSource(Source):
    """The user's own torch DataLoader, its order untouched; resumes by replaying the epoch's opening and skipping indices."""

    def __init__(self, loader: DataLoader, worker_rng: bool) -> None:
        batches = loader.batch_sampler
        assert isinstance(batches, BatchSampler) and loader.batch_size is not None  # adopt refuses any other batching
        self.loader, self.batch_size = loader, loader.batch_size
        # A loader adopted before (a second Session over it) already holds the stand-in.
        self.user_sampler = user_sampler(batches)
        self.positioned = _Positioned(self.user_sampler)
        batches.sampler = self.positioned
        self.generators = {}
        if loader.generator is not None:
            self.generators[LOADER_GENERATOR] = loader.generator
        own = getattr(self.user_sampler, "generator", None)
        if isinstance(own, torch.Generator) and own is not loader.generator:
            self.generators[SAMPLER_GENERATOR] = own
        self.steps_per_epoch = len(loader)
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"The DataLoader yields no batch (batch size {loader.batch_size}, {len(self.user_sampler)} samples on this "
                "rank). Lower the batch size."
            )
        self._opened: dict[str, torch.Tensor] = {}
        self._opened_epoch: Any = None  # the sampler's own epoch when this epoch's iterator opened
        self.keeps_workers = loader.persistent_workers and loader.num_workers > 0
        self._born: dict[str, Any] | None = None  # persistent workers: the epoch and RNG states of the opening that started them
        # The sampler's own seed where it has one (DistributedSampler), else this process's torch seed; saved either way.
        seed = getattr(self.user_sampler, "seed", None)
        self.seeding = _seed_workers(loader, seed if isinstance(seed, int) else torch.initial_seed()) if worker_rng else None

    def _rng_states(self) -> dict[str, torch.Tensor]:
        return {"torch": torch.get_rng_state(), **{name: g.get_state() for name, g in self.generators.items()}}

    def _set_rng_states(self, states: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(states["torch"])
        for name, g in self.generators.items():
            g.set_state(states[name])

    def open(self, epoch: int, step_in_epoch: int, resuming: bool) -> Iterator[Any]:
        self.positioned.at(step_in_epoch * self.batch_size)
        if self.seeding is not None:
            self.seeding.epoch = epoch
        if not resuming:
            self._opened = self._rng_states()
            self._opened_epoch = getattr(self.user_sampler, "epoch", None)
        elif self._opened_epoch is not None and getattr(self.user_sampler, "epoch", None) != self._opened_epoch:
            # Replay the opening exactly as the interrupted run made it, the sampler's epoch included (the loop may set it
            # after the batches, or never); the feed puts the restored RNGs back afterwards (Feed._open).
            _set_epoch(self.user_sampler, self._opened_epoch)
        self._start_workers(epoch)
        self._set_rng_states(self._opened)
        batches = iter(self.loader)
        if resuming:
            self.positioned.prime()
        return batches

    def _start_workers(self, epoch: int) -> None:
        """Persistent workers that this process lacks: start them as the run first did, without loading a sample.

        The plain loop's loader starts them at the first epoch's opening, drawing their base seed there before the
        sampler's seed, and keeps them: later openings draw only the sampler's seed. A resumed process in a later epoch
        starts them from that first opening's RNG states with no index to load; the epoch's own opening then follows as
        a later epoch's does. (Where the loop iterated the loader before the Session, the workers ran already: resumed
        ones get another base seed, which per-sample seeding keeps away from the samples.)
        """
        if not self.keeps_workers:
            return
        # torch's loader caches the iterator that owns the persistent workers in `_iterator`.
        running = getattr(self.loader, "_iterator", None) is not None
        if self._born is None:
            self._born = {"epoch": None if running else epoch, "states": self._opened}
            return
        if running or self._born["epoch"] == epoch:
            return  # they run, or this opening is the one that starts them, as in the plain loop
        self._set_rng_states(self._born["states"])
        with self.positioned.hollow():
            iter(self.loader)

    def state_dict(self, epoch: int, step_in_epoch: int) -> dict:
        seed = None if self.seeding is None else self.seeding.seed
        return {
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "opened": dict(self._opened),
            "worker_seed": seed,
            "sampler_epoch": self._opened_epoch,
            "persistent_workers": self.keeps_workers,
            "workers_born": self._born,
            SAMPLES_KEY: dataset_size(self.loader.dataset),
        }

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        same_samples(state, dataset_size(self.loader.dataset))
        saved = bool(state.get("persistent_workers", False))
        if saved != self.keeps_workers:
            raise UsageError(
                f"The checkpoint's DataLoader had persistent_workers={saved}, this one has persistent_workers={self.keeps_workers}. "
                "Persistent workers draw their base seed from the RNG once, other workers at every epoch, so the run would go on "
                f"differently from the one that wrote the checkpoint. Set persistent_workers={saved} until this run ends."
            )
        self._opened = dict(state["opened"])
        self._opened_epoch = state.get("sampler_epoch")
        self._born = state.get("workers_born")
        if self.seeding is not None and state["worker_seed"] is not None:
            self.seeding.seed = state["worker_seed"]
        return state["epoch"], state["step_in_epoch"]

    def close(self) -> None:
        """Shut down the persistent workers and let the loader start new ones if iterated again. Done here, not left to
        interpreter exit, where multiprocessing's handler would wait forever on workers that ignore SIGTERM."""
        if not self.keeps_workers:
            return
        iterator, self.loader._iterator = self.loader._iterator, None
        if iterator is not None:
            iterator._shutdown_workers()  # type: ignore[attr-defined]  # torch's private method of a multi-process iterator


class StatefulSource(Source):
    """A loader (or the IterableDataset behind one) that saves and restores its own position; its epochs end when its iterator does."""

    def __init__(self, loader: Any, holder: Any, worker_rng: bool = True) -> None:
        self.loader, self.holder = loader, holder
        self.generators = {}
        generator = getattr(loader, "generator", None)
        if isinstance(generator, torch.Generator):
            self.generators[LOADER_GENERATOR] = generator
        self._length = _length(loader)
        # None: nothing opened since the start or the restore, so asking the loader would build an iterator (and draw
        # the workers' base seed from the global RNG) where the plain loop builds none.
        self._unopened: dict | None = {"loader": None}
        self.seeding = None
        if isinstance(loader, DataLoader) and worker_rng:
            self.seeding = _seed_workers(loader, torch.initial_seed())

    @property
    def batches_per_epoch(self) -> int | None:
        """`len(loader)` where it has one: the epoch still ends when the iterator does, as in the plain loop."""
        return self._length

    def open(self, epoch: int, step_in_epoch: int, resuming: bool) -> Iterator[Any]:
        self._unopened = None
        if self.seeding is not None:
            self.seeding.epoch = epoch
        return iter(self.loader)

    def state_dict(self, epoch: int, step_in_epoch: int) -> dict:
        own = self._unopened if self._unopened is not None else {"loader": self.holder.state_dict()}
        return {"epoch": epoch, "step_in_epoch": step_in_epoch, **own}

    def load_state_dict(self, state: dict) -> tuple[int, int]:
        if state["loader"] is not None:
            self.holder.load_state_dict(state["loader"])
        self._unopened = {"loader": state["loader"]}
        return state["epoch"], state["step_in_epoch"]


def user_sampler(batches: BatchSampler) -> Any:
    """The user's own sampler inside a loader's BatchSampler (behind legato's positioning stand-in, once adopted)."""
    return batches.sampler.sampler if isinstance(batches.sampler, _Positioned) else batches.sampler


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _seed_workers(loader: DataLoader, seed: int) -> SeedPerSample | None:
    """Install legato's worker setup (per-sample seeding, then the user's own worker_init_fn) on a loader with workers."""
    if loader.num_workers == 0:
        return None
    user_fn = loader.worker_init_fn
    if isinstance(user_fn, SeedPerSample):
        user_fn = user_fn.user_fn
    loader.worker_init_fn = SeedPerSample(seed, user_fn)
    return loader.worker_init_fn
