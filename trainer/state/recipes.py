"""Digests of state a rank copied only its share of: the digest rule's bytes, each tensor's digest left to its writer.

When a rank snapshots its state or stages an asynchronous checkpoint it copies
only the tensors it writes (legato.store.layout: its own files and its share
of the replicated state), so it cannot hash the other ranks' bytes. The
component digests stay the digests of `legato.state.hashing.digest` all the
same: `record` walks a component exactly as `digest` does and keeps the bytes
it feeds, except that each tensor's 16-byte digest is left as a reference,
`<component>:<n>` (the n-th tensor of the walk: the same on every rank for
replicated state, whose structure is the same everywhere). Each rank then
hashes the tensors it copied (`share`), and `complete` fills every rank's
references from its own digests first, then from the replicated digests of
whichever rank wrote them, and feeds the same bytes into one XXH3-128: the
result is `digest(value)` bit for bit (tests/unit/test_recipes.py).

A share is plain data (hex strings), so it travels in a rank's report. This
module must never read a tensor's bytes (hashing them is the copy owner's, in
its own time) and never guess: a reference no rank filled, or filled twice
with different digests, is an error, never a default.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import xxhash

from legato.state.digest_rule import feed
from legato.state.hashing import tensor_header

# A recipe: hex of bytes fed as they are, or [key] where the 16-byte digest of tensor `key` goes.
Recipe = list[Any]
OWN, REPLICATED = "own", "replicated"
SHARE = "share"  # the key of a share in a rank's report (and in its replay base)


class _Recorder:
    """Stands in for an XXH3 state: keeps what is fed, with references where tensor digests go."""

    def __init__(self) -> None:
        self.recipe: Recipe = []
        self._pending = bytearray()

    def update(self, data: bytes) -> None:
        self._pending += data

    def refer(self, key: str) -> None:
        self._flush()
        self.recipe.append([key])

    def done(self) -> Recipe:
        self._flush()
        return self.recipe

    def _flush(self) -> None:
        if self._pending:
            self.recipe.append(self._pending.hex())
            self._pending = bytearray()


def record(name: str, value: Any, on_tensor: Callable[[str, torch.Tensor], None]) -> Recipe:
    """The recipe of component `name`'s digest; `on_tensor(key, tensor)` sees each tensor of the walk with its key."""
    recorder = _Recorder()
    count = itertools.count()

    def leaf(h: _Recorder, tensor: Any) -> None:
        h.update(tensor_header(tensor))
        key = f"{name}:{next(count)}"
        on_tensor(key, tensor)
        h.refer(key)

    feed(recorder, value, leaf)
    return recorder.done()


def share(recipes: Mapping[str, Recipe], own: Mapping[str, bytes], replicated: Mapping[str, bytes]) -> dict[str, Any]:
    """A rank's share as plain data: its recipes, the digests only it uses (its own files), and those it wrote for every rank."""
    return {
        "recipes": dict(recipes),
        OWN: {key: d.hex() for key, d in own.items()},
        REPLICATED: {key: d.hex() for key, d in replicated.items()},
    }


def complete(shares: list[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Every rank's component digests (in the order of `shares`) once the ranks' shares meet."""
    pool: dict[str, str] = {}
    for rank, s in enumerate(shares):
        for key, d in s[REPLICATED].items():
            if pool.setdefault(key, d) != d:
                raise ValueError(f"two ranks wrote tensor {key} with different digests (rank {rank}: {d}, before: {pool[key]}); "
                                 "the replicated state differs between the ranks")
    return [_bake_all(rank, s, pool) for rank, s in enumerate(shares)]


def _bake_all(rank: int, s: Mapping[str, Any], pool: Mapping[str, str]) -> dict[str, str]:
    own = s[OWN]

    def lookup(key: str) -> bytes:
        d = own.get(key) or pool.get(key)
        if d is None:
            raise ValueError(f"no rank reported the digest of tensor {key}, which rank {rank}'s state holds")
        return bytes.fromhex(d)

    return {name: _bake(recipe, lookup) for name, recipe in s["recipes"].items()}


def _bake(recipe: Recipe, lookup: Callable[[str], bytes]) -> str:
    h = xxhash.xxh3_128()
    for segment in recipe:
        h.update(lookup(segment[0]) if isinstance(segment, list) else bytes.fromhex(segment))
    return h.hexdigest()
