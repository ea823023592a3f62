"""In-memory copies of the state: a rank's `Snapshot` of its share at one step, and the tensors of a batch.

The replay base and the staging buffer of an asynchronous checkpoint are both
Snapshots: CPU tensors allocated once and reused by later copies. A rank
copies only what it writes (the files legato.store.layout gives it: its own
state, and its share of the replicated state, which every rank holds alike),
and keeps the recipes of every component's digest (legato.state.recipes), so
the digests of the whole state are still known once the ranks' shares meet.
Of each replicated tensor it does not copy it takes the block sums
(legato.state.checksum) while it blocks, and of each it copies the same sums
later, from the copy, so that the meeting shows whether every rank held what
the writer wrote. A tensor that lives on a GPU keeps the digest of its device's
rule (legato.state.hashing), never XXH3 of its copy: a large one's lanes are
taken from the live tensor on the device while the copy is made (and land on
the host together, one copy per take); a small one's digest is computed by the
same rule from its copy on the host, when the share is asked for, which is the
same digest and keeps its kernel launches out of the loop's wait.
This module must never touch the disk or the process group, and never draw
from an RNG.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

import torch

from legato.state import recipes
from legato.state.checksum import block_sums
from legato.state.device_digest import Landing, device_digest, finish, lanes
from legato.state.hashing import Digests, follows_device_rule

# A GPU tensor at least this large has its lanes taken on the device while the loop waits; a smaller one costs less to
# digest by the rule from its host copy, later, than the twenty-odd kernel launches of its lanes.
LANES_ON_DEVICE_BYTES = 1 << 20


class Snapshot:
    """This rank's share of the state at one step (its files' tensors copied), with the recipes of every component digest.

    The tensor digests of its copies are computed at most once per copy (`share`) and stay with it (`seen`), so
    that a checkpoint writing these tensors does not hash them again.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.files: dict[str, Any] = {}  # file name -> content, as legato.store.layout lays it out, tensors copied
        self.seen = Digests()
        self.copy_s = 0.0  # how long the last copy took (the blocking part of an asynchronous checkpoint)
        self._recipes: dict[str, recipes.Recipe] = {}
        self._own: dict[str, torch.Tensor] = {}  # tensor key -> copy, in this rank's own files
        self._replicated: dict[str, torch.Tensor] = {}  # tensor key -> copy, written for every rank
        self._sums: dict[str, str] = {}  # tensor key -> block sums of the live replicated tensors another rank writes
        self._by_rule: set[str] = set()  # tensor keys of the copies whose live tensor follows the device rule
        self._landing = Landing({})  # the lanes taken on the device, of the large ones among them
        self._share: dict[str, Any] | None = None

    def take(self, step: int, parts: Mapping[str, Any], files: Mapping[str, Any], for_everyone: Collection[str]) -> None:
        """Copy `files` (this rank's files of the live state `parts`; `for_everyone`: those holding replicated state) and
        record the recipes of `parts`' digests."""
        start = time.perf_counter()
        self.seen, self._share = Digests(), None
        self.files = {name: _copy_into(self.files.get(name), content) for name, content in files.items()}
        copies: dict[int, tuple[torch.Tensor, bool]] = {}  # id(live tensor) -> (its copy, written for every rank)
        # A tensor in both kinds of file (rank 0's per-rank buffers) is its own: each rank holds its own values of those.
        for name in sorted(files, key=lambda n: n in for_everyone):
            _pair(files[name], self.files[name], name in for_everyone, copies)
        self._own, self._replicated, self._sums, self._by_rule = {}, {}, {}, set()
        taken: dict[str, torch.Tensor] = {}

        def found(key: str, live: torch.Tensor) -> None:
            if id(live) not in copies:  # another rank writes it and reports its digest; this rank shows it holds the same
                self._sums[key] = block_sums(live)
                return
            copy, everyone = copies[id(live)]
            (self._replicated if everyone else self._own)[key] = copy
            if follows_device_rule(live):
                self._by_rule.add(key)
                if live.nbytes >= LANES_ON_DEVICE_BYTES:
                    taken[key] = lanes(live)

        self._recipes = {name: recipes.record(name, value, found) for name, value in parts.items()}
        self._landing = Landing(taken)
        self.step = step
        self.copy_s = time.perf_counter() - start

    def share(self) -> dict[str, Any]:
        """This rank's share of the digests (legato.state.recipes.share), its copies hashed once."""
        if self._share is None:
            own = {key: self._digest(key, t) for key, t in self._own.items()}
            replicated = {key: self._digest(key, t) for key, t in self._replicated.items()}
            sums = {**self._sums, **{key: block_sums(t) for key, t in self._replicated.items()}}
            self._share = recipes.share(self._recipes, own, replicated, sums)
        return self._share

    def _digest(self, key: str, copy: torch.Tensor) -> bytes:
        """The digest of the live tensor `copy` was taken from: by the device rule where the live tensor followed it (its
        lanes taken on the device, or the rule run on the copy), else XXH3 of the copy's bytes."""
        if key not in self._by_rule:
            return self.seen.tensor(copy)
        return finish(self._landing.get(key), copy.nbytes) if key in self._landing else device_digest(copy)


def _copy_into(dst: Any, src: Any) -> Any:
    """A copy of `src` that reuses `dst`'s tensors wherever shape and dtype still fit."""
    if isinstance(src, torch.Tensor):
        if isinstance(dst, torch.Tensor) and dst.shape == src.shape and dst.dtype == src.dtype:
            return dst.copy_(src.detach())
        if src.device.type == "cpu":
            return src.detach().clone()
        # Pinned host memory: the device-to-host copy of a staged checkpoint runs at full speed.
        return torch.empty(src.shape, dtype=src.dtype, pin_memory=torch.cuda.is_available()).copy_(src.detach())
    if isinstance(src, Mapping):
        old = dst if isinstance(dst, Mapping) else {}
        return {k: _copy_into(old.get(k), v) for k, v in src.items()}
    if isinstance(src, (list, tuple)):
        olds = dst if isinstance(dst, (list, tuple)) and len(dst) == len(src) else [None] * len(src)
        items = [_copy_into(o, v) for o, v in zip(olds, src)]
        return items if isinstance(src, list) else tuple(items)
    return src  # numbers, strings, None: immutable


def _pair(live: Any, copy: Any, everyone: bool, into: dict[int, tuple[torch.Tensor, bool]]) -> None:
    """Record each tensor of `live` (by id) with its copy in `copy` (`_copy_into`'s result), the first record kept."""
    if isinstance(live, torch.Tensor):
        into.setdefault(id(live), (copy, everyone))
    elif isinstance(live, Mapping):
        for key, value in live.items():
            _pair(value, copy[key], everyone, into)
    elif isinstance(live, (list, tuple)):
        for value, copied in zip(live, copy):
            _pair(value, copied, everyone, into)


_LEAVES = (torch.Tensor, int)


def batch_leaves(batch: Any) -> list[Any]:
    """The leaves of a batch (what nested lists, tuples and mappings hold), in a fixed order: mapping keys sorted by repr."""
    if type(batch) in _LEAVES:  # a tensor, or the step index a Session without a loader yields: no generic checks
        return [batch]
    if isinstance(batch, Mapping):
        return [leaf for key in sorted(batch, key=repr) for leaf in batch_leaves(batch[key])]
    if isinstance(batch, (list, tuple)):
        return [leaf for item in batch for leaf in batch_leaves(item)]
    return [batch]


def batch_tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch (nested lists, tuples and dicts), in a fixed order."""
    return [leaf for leaf in batch_leaves(batch) if isinstance(leaf, torch.Tensor)]
