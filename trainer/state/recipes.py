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

That completion holds only where a rank's replicated tensors equal the
writer's. So every rank also reports the block sums (legato.state.checksum) of
each replicated tensor, written or not, and `complete` compares each with the
writer's: a rank whose copy differs (a loop that changed one rank's
parameters alone) gets, for each component holding such a tensor, a digest
that no state hashes to, and the references that differ are listed as
`diverged`, so a resume from it fails its verification naming the rank and
the cause instead of proving the writer's bytes for it.

A share is plain data (hex strings), so it travels in a rank's report. This
module must never read a tensor's bytes (hashing them is the copy owner's, in
its own time) and never guess: a reference no rank filled, or filled twice
with different digests, is an error, never a default; a copy that differs
from the writer's is never completed with the writer's digest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

from legato.state.digest_rule import feed
from legato.state.hashing import tensor_header

# A recipe: hex of bytes fed as they are, or [key] where the 16-byte digest of tensor `key` goes.
Recipe = list[Any]
OWN, REPLICATED, SUMS = "own", "replicated", "sums"
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


@dataclass
class Completed:
    """One rank's component digests once the shares met, and its replicated tensors that differ from their writer's copy."""

    components: dict[str, str]
    diverged: list[str] = field(default_factory=list)  # tensor keys, `<component>:<n>`
    writers: list[int] = field(default_factory=list)  # the ranks that wrote those tensors


def share(
    recipes: Mapping[str, Recipe], own: Mapping[str, bytes], replicated: Mapping[str, bytes], sums: Mapping[str, str]
) -> dict[str, Any]:
    """A rank's share as plain data: its recipes, the digests only it uses (its own files), those it wrote for every rank,
    and the block sums of every replicated tensor it holds (legato.state.checksum)."""
    return {
        "recipes": dict(recipes),
        OWN: {key: d.hex() for key, d in own.items()},
        REPLICATED: {key: d.hex() for key, d in replicated.items()},
        SUMS: dict(sums),
    }


def complete(shares: list[Mapping[str, Any]]) -> list[Completed]:
    """Every rank's component digests (in the order of `shares`) once the ranks' shares meet."""
    pool: dict[str, str] = {}
    writer: dict[str, int] = {}
    for rank, s in enumerate(shares):
        for key, d in s[REPLICATED].items():
            if pool.setdefault(key, d) != d:
                raise ValueError(
                    f"two ranks wrote tensor {key} with different digests (rank {rank}: {d}, before: {pool[key]}); "
                    "the replicated state differs between the ranks"
                )
            writer.setdefault(key, rank)
    return [_bake_all(rank, s, pool, writer, shares) for rank, s in enumerate(shares)]


def _bake_all(
    rank: int, s: Mapping[str, Any], pool: Mapping[str, str], writer: Mapping[str, int], shares: list[Mapping[str, Any]]
) -> Completed:
    own = s[OWN]
    diverged = sorted(key for key, sums in s[SUMS].items() if key in writer and shares[writer[key]][SUMS][key] != sums)

    def lookup(key: str) -> bytes:
        if key in diverged:  # its own bytes were never hashed: a digest no state hashes to, so a resume cannot prove it
            return xxhash.xxh3_128_digest(f"legato: rank {rank} diverged from its writer at {key}".encode())
        d = own.get(key) or pool.get(key)
        if d is None:
            raise ValueError(f"no rank reported the digest of tensor {key}, which rank {rank}'s state holds")
        return bytes.fromhex(d)

    components = {name: _bake(recipe, lookup) for name, recipe in s["recipes"].items()}
    return Completed(components, diverged, sorted({writer[key] for key in diverged}))


def _bake(recipe: Recipe, lookup: Callable[[str], bytes]) -> str:
    h = xxhash.xxh3_128()
    for segment in recipe:
        h.update(lookup(segment[0]) if isinstance(segment, list) else bytes.fromhex(segment))
    return h.hexdigest()
