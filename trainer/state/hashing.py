"""Content digests of training state: per tensor, per component, per rank, global.

One pass over the bytes: every tensor's raw bytes are hashed once with
XXH3-128 (`tensor_digest`), and everything else is a hash of small things: a
component's digest feeds type tags, shapes, dtypes, scalars and those tensor
digests into another XXH3-128, by the plain-data rule of
`legato.state.digest_rule` (which also combines rank and global hashes). The checkpoint writer reuses the same tensor
digests for the file-integrity hash of the bytes torch.save streams from the
very same memory (`Digests` remembers them by storage address), so a
checkpoint's state is hashed once. XXH3 is a non-cryptographic hash: it guards
against corruption and proves equality of bits, not against a forger (anyone
who can rewrite a file can rewrite its manifest too).

It must never draw from an RNG, move a tensor in place, or depend on anything
but the values (no ids, no addresses in a digest, no dict order of insertion
beyond what the state itself defines).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import xxhash

from legato.errors import UsageError
from legato.state.digest_rule import feed, global_hash, rank_hash, refuse
from legato.state.sharded import is_dtensor

__all__ = ["DIGEST_BYTES", "HASH_NAME", "Digests", "digest", "global_hash", "rank_hash", "raw_digest", "tensor_header"]

DIGEST_BYTES = 16
HASH_NAME = "xxh3_128"
# A GPU tensor's bytes reach the hash through two pinned host buffers of this size in turn.
STAGING_BYTES = 8 << 20


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
        if t.numel() == 0:
            return raw_digest(b"")
        if t.device.type == "cuda":
            return _cuda_digest(t)
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


_staging: list[torch.Tensor] = []
_staging_lock = threading.Lock()


def _cuda_digest(t: torch.Tensor) -> bytes:
    """XXH3-128 of a CUDA tensor's bytes, copied to the host in chunks through two pinned buffers in turn.

    Each chunk's copy runs while the chunk before it is hashed, and a copy into pinned memory runs at the bus's speed,
    where `.cpu()` copies the whole tensor through the driver's bounce buffer into pageable memory before anything is
    hashed: a resume's check and every state hash read the whole state off the GPU this way. The digest is the one-shot
    digest of the same bytes (XXH3's streaming form is the same function). The copies go on the tensor's current stream,
    so they follow the work that wrote it.
    """
    flat = t.contiguous().view(-1).view(torch.uint8)
    stream = torch.cuda.current_stream(t.device)
    h = xxhash.xxh3_128()
    with _staging_lock:
        if not _staging:
            _staging.extend(torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2))
        landing = None
        for i, start in enumerate(range(0, flat.numel(), STAGING_BYTES)):
            chunk = flat[start : start + STAGING_BYTES]
            buffer = _staging[i % 2][: chunk.numel()]
            buffer.copy_(chunk, non_blocking=True)
            copied = stream.record_event()
            if landing is not None:
                _hash_when_copied(h, *landing)
            landing = buffer, copied
        assert landing is not None  # `t` is not empty: Digests.tensor digests an empty tensor itself
        _hash_when_copied(h, *landing)
    return h.digest()


def _hash_when_copied(h: Any, buffer: torch.Tensor, copied: torch.cuda.Event) -> None:
    copied.synchronize()
    h.update(buffer.numpy())


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
