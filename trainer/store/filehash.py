"""Checkpoint files written with one hash pass, and read back as plain data.

A file's hash is XXH3-128 over its regions, where the big regions are the
tensor storages torch.save streams from the very memory the state digests
were computed on; the writer takes those digests instead of hashing the bytes
again, and the manifest lists the regions (`segments`) so that a reader checks
the file from its bytes alone (legato.store.manifest). torch's own zip CRC32 is
switched off for the same reason: the file hash covers it. Loading uses
`torch.load(weights_only=True)` only. This module must never unpickle
anything and never decide which files a checkpoint holds.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
from torch.utils.serialization import config as serialization_config

from legato.files import write_in_pieces
from legato.state.trees import leaves
from legato.store.manifest import HASH_KEY, region_record
from legato.system.io_threads import io_map

SEGMENT_MIN_BYTES = 4096  # smaller writes are hashed as part of the region around them


class _HashingWriter:
    """A file that hashes what passes through it, so torch.save streams to disk in one pass.

    A write whose buffer is a storage with a known digest becomes a segment of its own (its digest is
    reused, its bytes not hashed again); everything between segments is hashed as one region.
    """

    def __init__(self, f: io.BufferedWriter, known: dict[tuple[int, int], bytes]) -> None:
        self._f = f
        self._known = known
        self._combined = xxhash.xxh3_128()
        self._region = xxhash.xxh3_128()
        self._region_bytes = 0
        self.segments: list[list[int]] = []
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        found = self._known.get((_address(view), view.nbytes)) if view.nbytes >= SEGMENT_MIN_BYTES else None
        if found is None:
            self._region.update(view)
            self._region_bytes += view.nbytes
        else:
            self._close_region()
            self._combined.update(region_record("S", view.nbytes, found))
            self.segments.append([self.bytes, view.nbytes])
        self.bytes += view.nbytes
        return write_in_pieces(self._f, view)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        self._close_region()
        return self._combined.hexdigest()

    def _close_region(self) -> None:
        self._combined.update(region_record("G", self._region_bytes, self._region.digest()))
        self._region = xxhash.xxh3_128()
        self._region_bytes = 0


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0] if view.nbytes else 0


def save_all(files: dict[Path, Any], known: dict[tuple[int, int], bytes]) -> list[dict]:
    """torch.save each state to its path, fsynced, hashing it on the way: {hash, bytes, segments} for the manifest, in order.

    Each file on one of the process's I/O threads (legato.system.io_threads): the writes and fsyncs of different files
    overlap (the disk queues them and the file system commits their journal entries together; each fsync alone waits
    for its own), while pickling takes the GIL in turn.
    """
    return io_map(lambda item: _save_hashed(item[1], item[0], known), list(files.items()))


def _save_hashed(state: Any, path: Path, known: dict[tuple[int, int], bytes]) -> dict:
    # torch's config overrides are thread-local: the switch is set in the thread that saves, or torch.save computes a
    # CRC32 of every byte (0.09 s of CPU per 341 MiB here, as much as the write itself into a warm page cache).
    # A file of the same name in the temporary directory is what a killed earlier attempt left: replaced by a new file,
    # never written through (it could be a link).
    path.unlink(missing_ok=True)
    # patch() is added to torch's config modules at import (install_config_module); torch.save writes to any object
    # with write() and flush(), though its annotation names only IO[bytes].
    with serialization_config.patch({"save.compute_crc32": False}), open(path, "xb") as f:  # type: ignore[attr-defined]
        writer = _HashingWriter(f, known)
        torch.save(state, writer)  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
    return {HASH_KEY: writer.hexdigest(), "bytes": writer.bytes, "segments": writer.segments}


def load_file(path: Path, own: bool = True) -> Any:
    """Load one checkpoint file as plain data; never unpickles arbitrary objects.

    The file is read through a private mapping of its page cache, then each storage is copied into memory of its own
    (views of one storage stay views of one copy), so nothing restored keeps the file mapped. From the page cache, copying
    from the mapping took half the time of torch.load's reads into new memory (256 MiB: 0.062-0.077 s against 0.131-0.144 s;
    docs/benchmarks-log.md, "Restores through the page cache"); from disk, the copies overlap the reads. A resume loads before
    it verifies (legato.session.resume): the file may not match its hash yet, which weights_only makes safe to read.

    `own=False` leaves the storages on the mapping, for a state that is only copied into live tensors and then dropped
    (a module's state dict: `load_state_dict` copies it into the parameters and buffers): one copy fewer, and the
    mapping goes when the state does.
    """
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if own:
        _own_memory(state, {})
    return state


def _own_memory(tree: Any, copies: dict[tuple[int, int], torch.UntypedStorage]) -> None:
    """Move every tensor in `tree` (dicts, lists, tuples) onto a copy of its storage, in place: the containers, their
    types and attributes (a state dict's `_metadata`) stay as torch.load built them."""
    for leaf in leaves(tree):
        if not isinstance(leaf, torch.Tensor):
            continue
        storage = leaf.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in copies:
            copies[key] = storage.clone()
        with torch.no_grad():  # a saved Parameter is a leaf that requires grad
            leaf.set_(copies[key], leaf.storage_offset(), leaf.size(), leaf.stride())
