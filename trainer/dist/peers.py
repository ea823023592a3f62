"""This rank and its peers: rank, world size, the control group, and the object exchanges over it.

Control traffic gets its own gloo group: CPU tensors, and no interleaving with
DDP's buckets. This module must never decide what is exchanged, only move it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class Peers:
    """This rank's identity and the control group it shares with the others (None when alone)."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None

    @classmethod
    def join(cls) -> Peers:
        """Collective when distributed: this process's rank and a new gloo group for control traffic."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls(0, 1, None)
        return cls(dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo"))

    def gather(self, item: Any) -> list[Any]:
        """Collective: every rank's `item`, in rank order."""
        if self.group is None:
            return [item]
        items: list[Any] = [None] * self.world_size
        dist.all_gather_object(items, item, group=self.group)
        return items

    def from_leader(self, item: Any) -> Any:
        """Collective: rank 0's `item` on every rank."""
        if self.group is None:
            return item
        box = [item]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
