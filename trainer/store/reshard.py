"""Loading an FSDP2 checkpoint written by N ranks into M ranks: each new rank's shards cut from the overlapping old ones.

Opted into with `CheckpointPolicy(reshard=True)` (config `checkpoint.reshard: true`) only. Every DTensor record
(legato.state.sharded) carries its global shape, offsets and placements, so new rank r builds its chunk of each
tensor on the live 1-D mesh of M ranks by copying the overlap of every old rank's chunk into it, and hands
the result on as a record of the new layout: the usual restore then checks that chunk against what FSDP2 gives
this rank. What is not a DTensor is taken as follows, and the continuation is labelled "data position exact,
not bitwise" (another world size sums in another order):

- replicated state (counters, scheduler, shares): as saved;
- the data position (legato's resumable loader only): the samples all ranks consumed, re-divided over M ranks,
  which continues the same global order when the global batch (per-rank batch x ranks) is unchanged;
- other per-rank state (metrics, extras, gradients' non-DTensor parts): old rank r % N's;
- per-rank RNGs: old rank r's where it existed; a new rank keeps the streams its script seeded.

Checkpoints holding replicated DDP state or ZeroRedundancyOptimizer shards are refused (see `refusal`). A stop
checkpoint whose state is held by its replay is resharded from its base's files (the caller names them).
This module must never write to the disk, run a collective, or unpickle (files load with weights_only=True).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from legato.errors import UsageError
from legato.state.components import Component
from legato.state.loaders import SAMPLES_KEY
from legato.state.sharded import MARK, is_record
from legato.store import layout

DATA = "data"
SAMPLER_KEYS = {"seed", "epoch", "position"}  # legato.state.loaders.LegatoSource's state
SAMPLER_OPTIONAL_KEYS = {SAMPLES_KEY}  # the dataset's length, which a checkpoint of an older legato does not hold


def load(table: Iterable[Component], path: Path, rank: int, old: int, new: int, prefix: str = "") -> dict[str, Any]:
    """Every component's state for new rank `rank` of `new` from checkpoint `path` (its files under `prefix`) written by `old` ranks."""
    table = list(table)
    per_rank = [layout.load(table, path, r, prefix) for r in range(old)]
    base = per_rank[rank % old]
    states: dict[str, Any] = {}
    for c in table:
        if c.restore_last and rank >= old:
            continue  # a new rank's RNGs: the streams its script seeded
        if c.name == DATA:
            states[c.name] = _data(base[c.name], old, new)
            continue
        states[c.name] = _merge([s[c.name] for s in per_rank], rank % old, rank, new, c.name)
    return states


def _merge(trees: list[Any], base: int, rank: int, new: int, where: str) -> Any:
    """Old rank `base`'s tree with every DTensor record replaced by new rank `rank`'s chunk cut from all old ranks' records."""
    tree = trees[base]
    if isinstance(tree, dict):
        if is_record(tree):
            return {MARK: _chunk([t[MARK] for t in trees], rank, new, where)}
        return {k: _merge([t[k] for t in trees], base, rank, new, f"{where}.{k}") for k in tree}
    if isinstance(tree, (list, tuple)):
        items = [_merge([t[i] for t in trees], base, rank, new, f"{where}[{i}]") for i in range(len(tree))]
        return items if isinstance(tree, list) else tuple(items)
    return tree


def _chunk(records: list[dict], rank: int, new: int, where: str) -> dict:
    """New rank `rank`'s record of a tensor sharded (or replicated) over a 1-D mesh of `new` ranks, from the old chunks."""
    first = records[0]
    if len(first["placements"]) != 1 or first["mesh"] != list(range(len(records))):
        raise UsageError(
            f"The checkpoint's {where} lives on a device mesh {first['mesh']} with placements {first['placements']}; resharding "
            "handles FSDP2 over one 1-D mesh of all ranks only (not HSDP or tensor parallelism). Resume with the world size that "
            "wrote it."
        )
    shape = list(first["shape"])
    placement = first["placements"][0]
    if placement[0] == "replicate":
        return {**first, "mesh": list(range(new)), "offsets": [0] * len(shape), "local_shape": shape}
    dim = placement[1]
    size = math.ceil(shape[dim] / new)  # FSDP2 chunks like torch.chunk: every rank ceil(n / ranks), the last ones less or none
    lo = min(rank * size, shape[dim])
    hi = min(lo + size, shape[dim])
    local_shape = [*shape[:dim], hi - lo, *shape[dim + 1 :]]
    part = torch.empty(local_shape, dtype=first["local"].dtype)
    covered = 0
    for r in records:
        start, stop = max(lo, r["offsets"][dim]), min(hi, r["offsets"][dim] + r["local_shape"][dim])
        if start < stop:
            part.narrow(dim, start - lo, stop - start).copy_(r["local"].narrow(dim, start - r["offsets"][dim], stop - start))
            covered += stop - start
    if covered != hi - lo:
        raise UsageError(
            f"The checkpoint's shards of {where} do not cover rows {lo}..{hi} of dimension {dim}: a shard file is "
            "missing or from another layout. Resume from another checkpoint, or with the world size that wrote it."
        )
    offsets = [0] * len(shape)
    offsets[dim] = lo
    return {**first, "local": part, "local_shape": local_shape, "offsets": offsets, "mesh": list(range(new))}


def _data(state: Any, old: int, new: int) -> dict:
    """The data position of one old rank re-divided over `new` ranks: the same count of samples consumed by all ranks."""
    if not isinstance(state, dict) or not SAMPLER_KEYS <= set(state) <= SAMPLER_KEYS | SAMPLER_OPTIONAL_KEYS:
        raise UsageError(
            "checkpoint.reshard needs legato's resumable loader (legato.resumable_loader), whose position is a count of samples "
            "in one global order; this run's loader keeps its own position per rank. Resume with the world size that wrote it."
        )
    consumed = state["position"] * old
    if consumed % new:
        raise UsageError(
            f"The checkpoint's ranks consumed {consumed} samples of epoch {state['epoch']}, which {new} ranks cannot share evenly: "
            f"keep the global batch (per-rank batch x ranks) of the run that wrote it, a multiple of {new}."
        )
    return {**state, "position": consumed // new}
