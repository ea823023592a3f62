"""The digest rule for plain data, torch-free: how numbers, strings, bytes, lists and dicts feed an XXH3-128,
and how component digests combine into a rank hash and rank hashes into the global hash.

`legato.state.hashing` extends the rule with tensors; `legato.store.manifest`
uses it to recompute a manifest's rank and global hashes from its own
component digests without importing torch. It must never import torch, and
never change a byte of what it feeds: every published hash depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xxhash

Leaf = Callable[[Any, Any], None]


def refuse(h: Any, value: Any) -> None:
    """What no rule covers: a TypeError naming the type."""
    raise TypeError(f"cannot hash a {type(value).__name__} in training state; store plain data")


def feed(h: Any, value: Any, leaf: Leaf = refuse) -> None:
    """Feed `value` into hash `h`; `leaf(h, value)` takes whatever is not plain data (a tensor, for `hashing`)."""
    if isinstance(value, Mapping):
        h.update(b"{%d" % len(value))
        for key in sorted(value, key=repr):
            feed(h, key, leaf)
            feed(h, value[key], leaf)
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[%d" % len(value))
        for item in value:
            feed(h, item, leaf)
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
        leaf(h, value)


def plain_digest(value: Any) -> str:
    """Hex digest of plain data (no tensors)."""
    h = xxhash.xxh3_128()
    feed(h, value)
    return h.hexdigest()


def rank_hash(components: Mapping[str, str]) -> str:
    """One digest over a rank's component digests, in name order."""
    return plain_digest({name: components[name] for name in sorted(components)})


def global_hash(rank_hashes: Sequence[str]) -> str:
    """One digest over the rank hashes, in rank order."""
    return plain_digest(list(rank_hashes))
