"""Content digests of training state: per tensor, per component, per rank, global.

One pass over the bytes: every tensor's raw bytes are digested once, and everything else is a hash of small things: a
component's digest feeds type tags, shapes, dtypes, scalars and those tensor digests into another XXH3-128, by the
plain-data rule of `legato.state.digest_rule` (which also combines rank and global hashes). A tensor on the CPU is
digested with XXH3-128 of its bytes, and the checkpoint writer reuses those digests for the file-integrity hash of the
bytes torch.save streams from the very same memory (`Digests` remembers them by storage address), so a checkpoint's
state is hashed once. A tensor on a CUDA device is digested where it lives, by the device rule
(legato.state.device_digest), so its bytes never cross the bus for a digest; a copy of it on the host reports the
rule of the device it was copied from (legato.state.snapshot): the rule follows the state, not the copy. Neither is a
cryptographic hash: they guard against corruption and prove equality of bits, not against a forger (anyone who can
rewrite a file can rewrite its manifest too).

It must never draw from an RNG, move a tensor in place, or depend on anything
but the values (no ids, no addresses in a digest, no dict order of insertion
beyond what the state itself defines).
"""

from __future__ import annotations

from typing import Any

import torch
import xxhash

from legato.errors import UsageError
from legato.state.device_digest import RULE, device_digest
from legato.state.digest_rule import feed, global_hash, rank_hash, refuse
from legato.state.sharded import is_dtensor

__all__ = [
    "DEVICE_RULE_ON",
    "HOST_RULE",
    "Digests",
    "digest",
    "follows_device_rule",
    "global_hash",
    "rank_hash",
    "raw_digest",
    "tensor_header",
    "tensor_rules",
]

# The device types whose tensors are digested where they live (legato.state.device_digest); XXH3 on the host elsewhere.
DEVICE_RULE_ON = ("cuda",)
HOST_RULE = "xxh3_128"


def tensor_rules() -> dict[str, str]:
    """Which rule digests a tensor, by the device type it lives on ("elsewhere": every other type): a manifest records it."""
    return {**dict.fromkeys(DEVICE_RULE_ON, RULE), "elsewhere": HOST_RULE}


def follows_device_rule(t: torch.Tensor) -> bool:
    """Whether `t`'s digest is the device rule's (it lives on a CUDA device), not XXH3 of its bytes on the host."""
    return t.device.type in DEVICE_RULE_ON


def raw_digest(data: Any) -> bytes:
    """XXH3-128 of a buffer's bytes (16 bytes): the one hash of every tensor, file region and segment."""
    return xxhash.xxh3_128_digest(data)


class Digests:
    """Tensor digests of one pass, remembered by (storage address, size) while the memory stays unchanged.

    A staged or snapshot copy keeps one of these: the file writer looks up the storages torch.save
    hands it instead of hashing their bytes again. Drop it whenever the memory is written to.
    """

    def __init__(self) -> None:
        self.by_storage: dict[tuple[int, int], bytes] = {}

    def tensor(self, t: torch.Tensor) -> bytes:
        t = t.detach()
        if follows_device_rule(t):
            return device_digest(t)  # never remembered by storage: the file writer's digests are XXH3 of the bytes
        if t.numel() == 0:
            return raw_digest(b"")
        if t.device.type != "cpu" or not t.is_contiguous():
            return raw_digest(t.cpu().contiguous().view(-1).view(torch.uint8).numpy())
        # The checks run for every tensor of every state hash, so each torch call is made once.
        storage, nbytes = t.untyped_storage(), t.nbytes
        key = (storage.data_ptr(), nbytes) if t.storage_offset() == 0 and storage.nbytes() == nbytes else None
        known = self.by_storage.get(key) if key is not None else None
        if known is not None:
            return known
        d = raw_digest(t.view(-1).view(torch.uint8).numpy())
        if key is not None:
            self.by_storage[key] = d
        return d


def digest(value: Any, seen: Digests | None = None) -> str:
    """Hex digest of a nested structure of tensors, numbers, strings, lists and dicts."""
    h = xxhash.xxh3_128()
    seen = seen if seen is not None else Digests()
    feed(h, value, lambda hh, v: _leaf(hh, v, seen))
    return h.hexdigest()


def _leaf(h: Any, value: Any, seen: Digests) -> None:
    """Tensors by dtype, shape and their bytes' digest; anything else not plain is refused."""
    h.update(tensor_header(value) + seen.tensor(value))


def tensor_header(value: Any) -> bytes:
    """What a tensor feeds before its bytes' digest (dtype and shape); a DTensor or anything else not plain is refused."""
    if is_dtensor(value):
        raise UsageError(
            "The training state holds a DTensor (an FSDP2 or tensor-parallel shard) in a component that legato saves as replicated "
            "or plain per-rank state, where one rank's shard would stand for every rank's. Pass the fully_shard'ed model itself as "
            "model= (its optimizer, gradients and extras are then saved as each rank's shards)."
        )
    if not isinstance(value, torch.Tensor):
        refuse(None, value)
    return f"t{value.dtype}{tuple(value.shape)}:".encode()
