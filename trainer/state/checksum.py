"""A cheap exact-arithmetic checksum of a tensor's bytes, taken where the tensor lives: how ranks compare replicated copies.

Replicated state (a DDP model, its optimizer) is written once, each tensor by
one rank (legato.store.layout), and an asynchronous checkpoint or a replay
base copies and hashes only the rank's own share (legato.state.recipes). Every
other rank must still show that its live copy of each tensor it did not write
equals the writer's, or its completed digest would claim bytes it never held.
Hashing those copies whole would cost the blocking part of the checkpoint what
the shares saved, so each rank takes `block_sums` instead: the tensor's bytes
read as int64 words, summed in 64 blocks (the last bytes that fill no word of
every block summed one by one) with int64 arithmetic, which wraps and is
therefore exact and independent of the reduction's order, threads and
device. One read of the bytes, no copy to the host (on a GPU it runs on the
device; 65 numbers travel), at about XXH3's speed on one CPU core and faster
with torch's threads.

It is a checksum, not a hash: a copy that differs from the writer's only by
values exchanged within one block, or by differences that cancel modulo 2**64,
passes. Diverging training changes the bits of many values at random, which
it cannot miss in practice; the digests stay the proof of the writer's bytes.

This module must never move the tensor off its device, write to it, or draw
from an RNG.
"""

from __future__ import annotations

import torch
import xxhash

from legato.state.device_digest import word_aligned_bytes

BLOCKS = 64
WORD = 8  # bytes: the bulk is read as int64 words, whose sum needs no cast (a cast reads 8x slower)


def block_sums(tensor: torch.Tensor) -> str:
    """Hex XXH3-128 of the tensor's dtype, shape and the int64 sums of its bytes by block."""
    t = tensor.detach()
    data = word_aligned_bytes(t)
    bulk = data.numel() // (WORD * BLOCKS) * WORD * BLOCKS
    sums = data[:bulk].view(torch.int64).view(BLOCKS, -1).sum(1)
    tail = data[bulk:].sum(dtype=torch.int64).reshape(1)  # fewer than WORD * BLOCKS bytes, each its own term
    h = xxhash.xxh3_128(f"{t.dtype}{tuple(t.shape)}:".encode())
    h.update(torch.cat([sums, tail]).cpu().numpy().tobytes())
    return h.hexdigest()
