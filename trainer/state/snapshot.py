"""In-memory copies of the state: a `Snapshot` of every component at one step, and the tensors of a batch.

The replay base and the staging buffer of an asynchronous checkpoint are both
Snapshots: CPU tensors allocated once and reused by later copies, with their
component digests computed at most once per copy. This module must never
touch the disk or the process group, and never draw from an RNG.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from legato.state.hashing import Digests, digest


class Snapshot:
    """The state of every component at one step, copied into CPU tensors that later copies reuse.

    Its component digests are computed at most once per copy (`digests`), and the tensor digests of that
    pass stay with it (`seen`) so that a checkpoint writing these tensors does not hash them again.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.parts: dict[str, Any] = {}
        self.seen = Digests()
        self.copy_s = 0.0  # how long the last copy took (the blocking part of an asynchronous checkpoint)
        self._digests: dict[str, str] | None = None

    def take(self, step: int, parts: Mapping[str, Any]) -> None:
        start = time.perf_counter()
        self.seen, self._digests = Digests(), None
        self.parts = _copy_into(self.parts, parts)
        self.step = step
        self.copy_s = time.perf_counter() - start

    def digests(self) -> dict[str, str]:
        if self._digests is None:
            self._digests = {name: digest(value, self.seen) for name, value in self.parts.items()}
        return self._digests


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
        old = dst if isinstance(dst, (list, tuple)) and len(dst) == len(src) else [None] * len(src)
        items = [_copy_into(o, v) for o, v in zip(old, src)]
        return items if isinstance(src, list) else tuple(items)
    return src  # numbers, strings, None: immutable


def batch_tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch (nested lists, tuples and dicts), in a fixed order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for key in sorted(batch, key=repr) for t in batch_tensors(batch[key])]
    if isinstance(batch, (list, tuple)):
        return [t for item in batch for t in batch_tensors(item)]
    return []
