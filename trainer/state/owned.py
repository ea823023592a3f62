"""State the user's loop owns, as torch `Stateful`s: its RNG objects, accumulated gradients, a carried batch.

- `as_stateful` takes an `extras` value as it is: a `torch.Generator`, a
  `numpy.random.Generator`, a `random.Random`, or anything with
  `state_dict`/`load_state_dict`; anything else is refused (UsageError).
- `Gradients`: the `.grad` of every parameter, so a checkpoint taken in the
  middle of a gradient accumulation (DDP `no_sync()` micro-steps) resumes
  with the partial sums; `None` stays `None`.
- `Carried`: the batch a prefetching loop holds into the next step. On
  restore the held tensors are overwritten in place, because the loop keeps
  its own references to them, and its plain values are written back into
  their dicts and lists.

Capturing never draws from a generator and never copies more than the state.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
import torch

from legato.errors import UsageError
from legato.state import components as table
from legato.state.snapshot import batch_leaves, batch_tensors


class TorchGenerator:
    """A `torch.Generator` as a `Stateful`."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


class NumpyGenerator:
    """A `numpy.random.Generator` as a `Stateful`."""

    def __init__(self, generator: np.random.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        state = self.generator.bit_generator.state
        return {"kind": state["bit_generator"], "words": _words(state)}

    def load_state_dict(self, state: dict) -> None:
        current = self.generator.bit_generator.state
        if current["bit_generator"] != state["kind"]:
            raise UsageError(
                f"A numpy Generator extra was saved as {state['kind']} and is now {current['bit_generator']}. Build it "
                "with the same bit generator."
            )
        self.generator.bit_generator.state = _unwords(current, state["words"])


def _words(state: Mapping[str, Any]) -> list:
    """numpy's bit-generator state as plain ints and int tensors (weights_only-safe)."""
    out: list[list[Any]] = []  # [key, nested words, tensor or int string]
    for key in sorted(state):
        value = state[key]
        if isinstance(value, dict):
            out.append([key, _words(value)])
        elif isinstance(value, np.ndarray):
            out.append([key, torch.from_numpy(value.astype(np.int64))])
        elif isinstance(value, str):
            continue
        else:
            out.append([key, str(int(value))])  # PCG64's 128-bit ints do not fit a tensor
    return out


def _unwords(template: Mapping[str, Any], words: list) -> dict:
    state = dict(template)
    for key, value in words:
        old = template[key]
        if isinstance(old, dict):
            state[key] = _unwords(old, value)
        elif isinstance(old, np.ndarray):
            state[key] = value.numpy().astype(old.dtype)
        else:
            state[key] = int(value)
    return state


class PythonRandom:
    """A `random.Random` as a `Stateful` (its internal state as an int64 tensor)."""

    def __init__(self, generator: random.Random) -> None:
        self.generator = generator

    def state_dict(self) -> dict:
        version, internal, gauss_next = self.generator.getstate()
        return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss_next}

    def load_state_dict(self, state: dict) -> None:
        internal = tuple(int(x) for x in state["internal"].tolist())
        self.generator.setstate((state["version"], internal, state["gauss_next"]))


RNG_ADAPTERS = (TorchGenerator, NumpyGenerator, PythonRandom)


def as_stateful(name: str, obj: Any) -> Any:
    """`obj` as a Stateful: RNG objects get an adapter, anything with state_dict/load_state_dict is taken as is."""
    if isinstance(obj, torch.Generator):
        return TorchGenerator(obj)
    if isinstance(obj, np.random.Generator):
        return NumpyGenerator(obj)
    if isinstance(obj, random.Random):
        return PythonRandom(obj)
    table.check_stateful(name, obj)
    return obj


def is_rng(obj: Any) -> bool:
    """RNG extras are restored last, right before the first resumed step, like every other RNG."""
    return isinstance(obj, RNG_ADAPTERS)


class Gradients:
    """Every parameter's .grad (None stays None): the partial sums of an unfinished accumulation."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = list(module.parameters())

    def state_dict(self) -> dict:
        return {"grads": [p.grad for p in self.params]}

    def load_state_dict(self, state: dict) -> None:
        for p, g in zip(self.params, state["grads"], strict=True):
            p.grad = None if g is None else g.detach().clone().to(p.device)


class Carried:
    """The batch the loop keeps between steps (`Session.carry`); restored into the same tensors and containers.

    Its plain values (text, numbers, None: ids, lengths, a token count) are saved too and written back into their dict
    or list; one that sits in a tuple, or is the whole batch, cannot be written back, but is in the digest, so a resume
    where it differs fails its verification instead of going on with the pre-loop value."""

    def __init__(self) -> None:
        self.batch: Any = None

    def hold(self, batch: Any) -> None:
        odd = _unsaveable(batch)
        if odd is not None:
            raise UsageError(
                f"session.carry() got a batch holding {odd}, which legato can neither save nor restore, so a resume would go on "
                "with another value while it reports itself verified. Carry tensors (nested in dicts, lists and tuples) and plain "
                "values (text, numbers) in dicts or lists: torch.from_numpy() for arrays, .item() for numpy numbers, a dict "
                "of a dataclass's fields."
            )
        self.batch = batch

    @property
    def used(self) -> bool:
        return self.batch is not None

    def state_dict(self) -> dict:
        values = _plain_values(self.batch)
        # Only a batch with plain values has the key: a tensor-only batch keeps the digest it always had.
        return {"tensors": batch_tensors(self.batch), "values": values} if values else {"tensors": batch_tensors(self.batch)}

    def load_state_dict(self, state: dict) -> None:
        live = batch_tensors(self.batch)
        saved = state["tensors"]
        if len(live) != len(saved) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(live, saved)):
            raise UsageError(
                "The batch passed to session.carry() before the loop does not have the shapes and dtypes of the carried batch "
                "in the checkpoint. Carry a batch of the same structure (the first get_batch() of the run) before the loop."
            )
        with torch.no_grad():
            for a, b in zip(live, saved):
                a.copy_(b)
        values = state.get("values", [])
        if len(values) == len(_plain_values(self.batch)):
            _write_back(self.batch, iter(values))


_PLAIN = (str, int, float, bool, type(None))


def _is_plain(leaf: Any) -> bool:
    """Python's own text, numbers and None, exactly: a numpy scalar (a float subclass) would be saved as a numpy object,
    which a weights-only load refuses, leaving the checkpoint unloadable."""
    return type(leaf) in _PLAIN


def _unsaveable(batch: Any) -> str | None:
    """A description of the first leaf that is neither a tensor nor a plain value, or None."""
    odd = next((leaf for leaf in batch_leaves(batch) if not (isinstance(leaf, torch.Tensor) or _is_plain(leaf))), None)
    return None if odd is None else f"a {type(odd).__module__}.{type(odd).__qualname__}"


def _plain_values(batch: Any) -> list:
    """The batch's plain values, in batch_tensors' order."""
    return [leaf for leaf in batch_leaves(batch) if _is_plain(leaf)]


def _write_back(batch: Any, values: Any) -> None:
    """Put the saved plain values into the batch's dicts and lists, in the order `_plain_values` reads them."""
    slots = (
        ((key, batch[key]) for key in sorted(batch, key=repr))
        if isinstance(batch, Mapping)
        else enumerate(batch)
        if isinstance(batch, (list, tuple))
        else ()
    )
    for key, item in slots:
        if not _is_plain(item):
            _write_back(item, values)
            continue
        value = next(values)
        if isinstance(batch, (MutableMapping, list)):
            batch[key] = value


class ShardedOptimizer:
    """A ZeroRedundancyOptimizer as per-rank state: this rank's shard and the global parameter-group settings.

    Its own state_dict() needs a consolidation (a collective gathering every shard on one rank); each
    rank saving the shard it owns needs none, and resumes exactly at the same world size.
    """

    def __init__(self, zero: Any) -> None:
        self.zero = zero

    def state_dict(self) -> dict:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.zero.param_groups]
        return {"shard": self.zero.optim.state_dict(), "groups": groups}

    def load_state_dict(self, state: dict) -> None:
        self.zero.optim.load_state_dict(state["shard"])
        # The scheduler sets lr on the global groups; ZeRO copies them to the shard at its next step().
        for group, saved in zip(self.zero.param_groups, state["groups"], strict=True):
            group.update(saved)


def is_sharded(optimizer: Any) -> bool:
    """Whether `optimizer` is a ZeroRedundancyOptimizer (without importing its module for every Session)."""
    module = sys.modules.get("torch.distributed.optim")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)
