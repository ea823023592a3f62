"""This rank and its peers: rank, world size, the control group, and the object exchanges over it.

Control traffic gets its own gloo group: CPU tensors, and no interleaving with
DDP's buckets. The Session ends the group with its loop (`close`), while the
interpreter is whole: a gloo group still alive when Python finalizes keeps
threads that may touch Python objects then, and a rank that exits cleanly can
abort ("terminate called without an active exception"); a group the script
keeps (its world group, held by an FSDP2 model past `destroy_process_group()`)
is waited for at exit instead (`quiesce`). The loop's end also waits for every gloo
worker to let go of its last work: a work started during a backward (DDP's bucket
all-reduces) holds a Python object, and a worker still holding one when the
script's `main()` returns and frees its DDP model deadlocks the rank there (the
freeing thread holds the GIL and joins the worker, which waits for the GIL). This module must
never decide what is exchanged, only move it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from legato.dist.quiesce import settle, wait_at_exit


class Peers:
    """This rank's identity and the control group it shares with the others (None when alone)."""

    def __init__(self, rank: int, world_size: int, group: dist.ProcessGroup | None) -> None:
        self.rank, self.world_size = rank, world_size
        self._group = group
        self._closed = False

    @classmethod
    def join(cls) -> Peers:
        """Collective when distributed: this process's rank and a new gloo group for control traffic."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls(0, 1, None)
        wait_at_exit()
        return cls(dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo"))

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The control group; asking for it once it is closed is a bug (it would exchange nothing and agree on nothing)."""
        if self._closed:
            raise RuntimeError("the Session's control group was closed when its loop ended; nothing is exchanged after that")
        return self._group

    def close(self) -> None:
        """End the control group now (local, not collective). Every other holder of the group has let it go, so the
        group's gloo threads finish their last work and are joined here, not during the interpreter's shutdown."""
        if self._group is None:  # alone, or closed already
            return
        group, self._group, self._closed = self._group, None, True
        # Gone already when the script destroyed every process group before the Session ended.
        with contextlib.suppress(ValueError):
            dist.destroy_process_group(group)
        settle()

    def gather(self, item: Any) -> list[Any]:
        """Collective: every rank's `item`, in rank order."""
        if self.group is None:
            return [item]
        items: list[Any] = [None] * self.world_size
        dist.all_gather_object(items, item, group=self.group)
        return items

    def most(self, value: int) -> int:
        """Collective: the largest of every rank's `value` (one small all-reduce, no pickling)."""
        if self.group is None:
            return value
        box = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.group)
        return int(box[0])

    def from_leader(self, item: Any) -> Any:
        """Collective: rank 0's `item` on every rank."""
        if self.group is None:
            return item
        box = [item]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
