"""How the bundled loop shards a built-in task's model with FSDP2: fully_shard per block, then the root.

Each transformer block (`model.blocks`, where the task has them) becomes its
own FSDP2 unit with the configured mixed precision policy and resharding,
optionally wrapped so its activations are recomputed in the backward
(activation checkpointing outside the unit, so a recomputation gathers the
parameters again); the root module gets the rest. The device mesh is the one
dimension of all ranks, built on the default process group. This module only
wraps; it must never train, save or restore anything.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Checkpointed(nn.Module):
    """A block whose activations are recomputed in the backward instead of kept (torch.utils.checkpoint)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any) -> Any:
        return checkpoint(self.block, *args, use_reentrant=False)


def fully_shard_model(model: nn.Module, device: torch.device, settings: Any) -> nn.Module:
    """`model` sharded in place over every rank (FSDP2), per `train.fsdp2` (`settings`); returns it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[settings.param_dtype], reduce_dtype=DTYPES[settings.reduce_dtype])
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        for i, block in enumerate(blocks):
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=settings.reshard_after_forward)
            if settings.activation_checkpointing:
                blocks[i] = Checkpointed(block)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
