"""Content digests of training state: per component, per rank, global.

A digest is computed from live objects (state dicts, RNG states, counters) by
walking plain nested data and feeding type tags, shapes, dtypes and raw bytes
into SHA-256 (truncated to 128 bits; SHA-256 has CPU instructions on current
x86 and ARM servers, which makes it the fastest of hashlib's choices there). It must never draw from an RNG, move a tensor in place, or
depend on anything but the values (no ids, no addresses, no dict order of
insertion beyond what the state itself defines).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

DIGEST_BYTES = 16


def digest(value: Any) -> str:
    """Hex digest of a nested structure of tensors, numbers, strings, lists and dicts."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()[: 2 * DIGEST_BYTES]


def rank_hash(components: Mapping[str, str]) -> str:
    """One digest over a rank's component digests, in name order."""
    return digest({name: components[name] for name in sorted(components)})


def global_hash(rank_hashes: Sequence[str]) -> str:
    """One digest over the rank hashes, in rank order."""
    return digest(list(rank_hashes))


def _feed(h: hashlib._Hash, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        _feed_tensor(h, value)
    elif isinstance(value, Mapping):
        h.update(b"{%d" % len(value))
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[%d" % len(value))
        for item in value:
            _feed(h, item)
        h.update(b"]")
    elif isinstance(value, bool) or value is None:
        h.update(b"b" + repr(value).encode())
    elif isinstance(value, int):
        h.update(b"i" + str(value).encode() + b";")
    elif isinstance(value, float):
        h.update(b"f" + value.hex().encode() + b";")
    elif isinstance(value, str):
        data = value.encode()
        h.update(b"s%d:" % len(data) + data)
    elif isinstance(value, bytes):
        h.update(b"y%d:" % len(value) + value)
    else:
        raise TypeError(f"cannot hash a {type(value).__name__} in training state; store plain data")


def _feed_tensor(h: hashlib._Hash, t: torch.Tensor) -> None:
    t = t.detach()
    h.update(f"t{t.dtype}{tuple(t.shape)}:".encode())
    if t.numel() == 0:
        return
    flat = t.cpu().contiguous().reshape(-1)
    h.update(flat.view(torch.uint8).numpy().data)
