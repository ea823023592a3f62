"""FSDP2 (DTensor) state as plain data: this rank's local shards with DCP-style chunk metadata, and back.

A `fully_shard`ed model's state dict, its optimizer's state and its gradients
hold DTensors: each rank has one chunk of every tensor. `Shards` wraps such a
Stateful so the rest of legato sees plain data: every DTensor becomes a small
record of the local tensor and the metadata Distributed Checkpoint keeps for a
chunk (global shape, offsets, placements, the mesh's ranks), which digests,
`torch.save` and `torch.load(weights_only=True)` take as they are. Restoring
rebuilds each DTensor on the live device mesh after checking that the saved
chunk is the one this rank holds now (same global shape, offsets and
placements), so a shard can never be loaded into another rank's place.

This module must never touch the disk, run a collective (DTensors are built
with `run_check=False`, nothing is redistributed) or draw from an RNG.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from legato.errors import UsageError
from legato.state.trees import DESCEND, rebuilt

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

MARK = "dtensor"  # the key of a DTensor's record: {"dtensor": {"local": ..., "shape": ..., ...}}


def _dtensor_class() -> type | None:
    """The DTensor class when its module is loaded (a model can only hold DTensors then); None otherwise."""
    module = sys.modules.get("torch.distributed.tensor")
    return None if module is None else module.DTensor


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """Whether `value` is a DTensor (without importing torch.distributed.tensor for every Session)."""
    cls = _dtensor_class()
    return cls is not None and isinstance(value, cls)


def holds_dtensors(module: torch.nn.Module) -> bool:
    """Whether `module`'s parameters are DTensors: a `fully_shard`ed (FSDP2) or tensor-parallel model."""
    return any(is_dtensor(p) for p in module.parameters())


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of `t`: a DTensor's local tensor, any other tensor (or None) as it is."""
    return t.to_local() if is_dtensor(t) else t


def meshes_of(module: torch.nn.Module) -> Callable[[], list[Any]]:
    """The device meshes `module`'s parameters live on, looked up when a restore needs them."""

    def meshes() -> list[Any]:
        found: list[Any] = []
        for p in module.parameters():
            if is_dtensor(p) and not any(p.device_mesh is m for m in found):
                found.append(p.device_mesh)
        return found

    return meshes


def _placement(p: Any) -> list:
    if p.is_shard() and type(p).__name__ == "Shard":
        return ["shard", p.dim]
    if p.is_replicate():
        return ["replicate"]
    raise UsageError(
        f"A DTensor in the training state has the placement {p!r}; legato saves Shard and Replicate placements only "
        "(FSDP2's fully_shard and plain tensor parallelism). Save this state another way, or open an issue naming the placement."
    )


def _placements(saved: list) -> tuple:
    from torch.distributed.tensor import Replicate, Shard

    return tuple(Shard(p[1]) if p[0] == "shard" else Replicate() for p in saved)


def _chunk(shape: torch.Size, mesh: Any, placements: tuple) -> tuple[list[int], list[int]]:
    """This rank's local shape and global offsets of a tensor of `shape` under `placements` (DCP's chunk metadata)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local_shape, offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
    return list(local_shape), list(offsets)


def _record(t: Any) -> dict:
    part = t.to_local().detach()
    if part.untyped_storage().nbytes() != part.nbytes:
        # FSDP2 keeps an uneven shard as a view into a padded buffer: torch.save would write the padding too.
        part = part.clone()
    mesh = t.device_mesh
    local_shape, offsets = _chunk(t.shape, mesh, t.placements)
    return {
        MARK: {
            "local": part,
            "shape": list(t.shape),
            "local_shape": local_shape,
            "offsets": offsets,
            "placements": [_placement(p) for p in t.placements],
            "mesh": mesh.mesh.tolist(),
        }
    }


def to_plain(value: Any) -> Any:
    """`value` with every DTensor replaced by its record (this rank's shard and its chunk metadata)."""
    return rebuilt(value, lambda node, _: _record(node) if is_dtensor(node) else DESCEND)


def from_plain(value: Any, meshes: list[Any], where: str = "") -> Any:
    """`value` with every record turned back into a DTensor on the live mesh of the same ranks."""
    return rebuilt(value, lambda node, path: _rebuild(node[MARK], meshes, path) if is_record(node) else DESCEND, where)


def is_record(node: Any) -> bool:
    """Whether `node` is a DTensor's record, as `to_plain` writes it."""
    return isinstance(node, Mapping) and set(node) == {MARK} and isinstance(node[MARK], Mapping)


def _rebuild(record: dict, meshes: list[Any], where: str | None) -> Any:
    from torch.distributed.tensor import DTensor

    mesh = next((m for m in meshes if m.mesh.tolist() == record["mesh"]), None)
    if mesh is None:
        raise UsageError(
            f"The checkpoint's shard of {where} lives on a device mesh of ranks {record['mesh']}, which this run does not have "
            f"(its meshes: {[m.mesh.tolist() for m in meshes]}). Resume with the same ranks and the same fully_shard layout."
        )
    shape = torch.Size(record["shape"])
    placements = _placements(record["placements"])
    expected = _chunk(shape, mesh, placements)
    part = record["local"]
    if expected != (record["local_shape"], record["offsets"]) or list(part.shape) != record["local_shape"]:
        raise UsageError(
            f"The checkpoint's shard of {where} is the chunk at offsets {record['offsets']} of shape {record['local_shape']}, but "
            f"this rank holds the chunk at {expected[1]} of shape {expected[0]}: the checkpoint was sharded otherwise. Resume "
            "with the same world size and fully_shard layout."
        )
    return DTensor.from_local(part, mesh, placements, run_check=False, shape=shape, stride=_contiguous_stride(shape))


def _contiguous_stride(shape: torch.Size) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


class Shards:
    """A Stateful holding DTensors (an FSDP2 model, its optimizer, its gradients) as this rank's shards, in plain data."""

    def __init__(self, obj: Any, meshes: Callable[[], list[Any]]) -> None:
        self.obj = obj
        self.meshes = meshes

    def state_dict(self) -> dict:
        return to_plain(self.obj.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self.obj.load_state_dict(from_plain(state, self.meshes()))


def unreduced_gradients(module: torch.nn.Module) -> list[str]:
    """FSDP2 parameters holding gradients of micro-batches run with gradient sync off, not yet reduced into `.grad`."""
    # FSDP2 has no public accessor for these; its FSDPParam attributes are read as torch 2.13 names them.
    names = []
    for sub in module.modules():
        # Module.__getattr__ is typed as returning a tensor or a module, not FSDP2's private method.
        state = sub._get_fsdp_state() if callable(getattr(sub, "_get_fsdp_state", None)) else None  # type: ignore[operator]
        group = None if state is None else state._fsdp_param_group
        for param in [] if group is None else group.fsdp_params:
            unsharded = getattr(param, "_unsharded_param", None)
            if param.unsharded_accumulated_grad is not None or (unsharded is not None and unsharded.grad is not None):
                names.append(str(param._param_fqn))
    return names


class ShardedGradients(Shards):
    """An FSDP2 model's gradients (its `.grad` shards), refused while an accumulation with gradient sync off holds others.

    Those partial sums live in FSDP2's unsharded parameters, outside `.grad`, until the synced micro-batch
    reduces them: a checkpoint then would lose them, so a step of the Session must end with a synced backward.
    """

    def __init__(self, gradients: Any, module: torch.nn.Module) -> None:
        super().__init__(gradients, meshes_of(module))
        self.module = module

    def state_dict(self) -> dict:
        pending = unreduced_gradients(self.module)
        if pending:
            raise UsageError(
                f"A Session step ended while FSDP2 held gradients not yet reduced ({', '.join(pending[:3])}"
                f"{', ...' if len(pending) > 3 else ''}): micro-batches ran with set_requires_gradient_sync(False) and the synced "
                "one did not follow in the same step. Run a step's whole accumulation inside one Session step, the last micro-batch "
                "with set_requires_gradient_sync(True)."
            )
        return super().state_dict()
