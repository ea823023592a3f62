"""The Session's rows of the component table (legato.state.components): every piece of a run's state, in restore order.

The model and optimizer are replicated by DDP (each rank writes its share of
them), sharded by a ZeroRedundancyOptimizer (each rank its own shard), or held
as FSDP2 DTensors (each rank its own shards of both). Then come the scheduler
and scaler (each rank's own), the counters and running metrics, the gradients, DDP's bucket
layout and forward-sync flag, the user's extras, the data position and, last, every RNG. This module
must never read or change the state it lists: it only names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from legato.dist.forward_sync import ForwardSync
from legato.dist.reduction import BucketLayout
from legato.session.position import Counters, DataPosition, Metrics, Position
from legato.session.wrappers import ddp_of, unwrap
from legato.state import file_names, rng
from legato.state.components import Component
from legato.state.optimizer import OptimizerState
from legato.state.owned import Gradients, ShardedOptimizer, is_rng, is_sharded
from legato.state.sharded import ShardedGradients, Shards, holds_dtensors, meshes_of


def session_table(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    position: Position,
    metrics: Metrics,
    extras: Mapping[str, Any],
    source: Any,
    generators: Mapping[str, Any],
) -> list[Component]:
    """Every piece of state, in restore order: replicated by DDP (its share written by each rank), this rank's own, or its
    FSDP2 shards."""
    module = unwrap(model)
    sharded = holds_dtensors(module)
    rows = (
        _sharded_rows(module, optimizer)
        if sharded
        else [
            # Buffers (batch-norm statistics) are updated by each rank's own forward after DDP's
            # broadcast, so they are per-rank state; parameters are replicated by the all-reduce.
            Component("model", module, file_names.MODEL_FILE, per_rank_keys=lambda: {name for name, _ in module.named_buffers()}),
            # A ZeroRedundancyOptimizer's state is sharded: each rank saves the shard it owns.
            Component("optimizer", ShardedOptimizer(optimizer))
            if is_sharded(optimizer)
            else Component("optimizer", OptimizerState(optimizer), file_names.TRAIN_STATE_FILE),
        ]
    )
    # Each rank's own, though usually alike: a scheduler may keep a per-rank metric (timm's step_update(n, metric=this
    # rank's loss average)), and one saved once would restore rank 0's value on every rank. A few numbers per rank.
    if scheduler is not None:
        rows.append(Component("scheduler", scheduler))
    if scaler is not None:
        rows.append(Component("scaler", scaler))
    own = (lambda obj: Shards(obj, meshes_of(module))) if sharded else (lambda obj: obj)
    rows += [
        Component("counters", Counters(position), file_names.TRAIN_STATE_FILE),
        Component("metrics", metrics),
        Component("grads", ShardedGradients(Gradients(module), module) if sharded else Gradients(module)),
        # After the gradients: a restored reducer takes them into its buckets as they are.
        Component("buckets", BucketLayout(ddp_of(model)), file_names.TRAIN_STATE_FILE),
        # Each rank's own: whether DDP's next forward broadcasts rank 0's buffers, as the step before left it.
        Component("forward_sync", ForwardSync(ddp_of(model))),
        *(Component(f"extra.{name}", own(obj), restore_last=is_rng(obj)) for name, obj in extras.items()),
        Component("data", DataPosition(position, source)),
        *(Component(name, obj, restore_last=True) for name, obj in rng.components(generators).items()),
    ]
    return rows


def _sharded_rows(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[Component]:
    """An FSDP2 (fully_shard) model and its optimizer hold DTensors: each rank saves its own shards of both."""
    meshes = meshes_of(module)
    return [
        Component("model", Shards(module, meshes), file_names.SHARD_FILE),
        Component("optimizer", Shards(OptimizerState(optimizer), meshes), file_names.SHARD_FILE),
    ]
