"""Which file of a checkpoint holds which component, and which rank writes it.

Inside a checkpoint directory (`prefix` "" for the checkpoint itself; the
replay base uses the same layout under `replay_`): `model.pt` (the model's
state dict alone), `train_state.pt` (name -> state of the other replicated
components), `rank<R>.pt` (name -> state of the per-rank components, plus
`<name>_buffers` for the per-rank keys of replicated ones), `<name>.shard<R>.pt`
(rank R's shards of a sharded component, FSDP2's DTensors as plain records:
legato.state.sharded; every rank writes its own). `writes` is the one
decision of which rank writes which file: a sharded layout (per-rank spread
writes, FSDP2 state) changes it there. This module must never know the
Session or touch the process group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from legato.errors import UsageError
from legato.state.components import MODEL_FILE, RANK_FILE, SHARD_FILE, Component
from legato.store.filehash import load_file

PER_RANK_SUFFIX = "_buffers"
_SOLE_FILES = (MODEL_FILE,)  # files that hold one component's state dict as is (readable without legato)
WRITER_OF_REPLICATED = 0  # replicated state is identical on every rank: one copy, from rank 0


def writes(rank: int, file: str) -> bool:
    """Whether rank `rank` writes `file` (a component's file: RANK_FILE or SHARD_FILE for its own, else a replicated one)."""
    return file in (RANK_FILE, SHARD_FILE) or rank == WRITER_OF_REPLICATED


def rank_file(rank: int, prefix: str = "") -> str:
    """The name of rank `rank`'s own file."""
    return f"{prefix}rank{rank}.pt"


def shard_file(name: str, rank: int, prefix: str = "") -> str:
    """The name of rank `rank`'s file of the sharded component `name`."""
    return f"{prefix}{name}.shard{rank}.pt"


def files(table: Iterable[Component], parts: Mapping[str, Any], rank: int, prefix: str = "") -> dict[str, Any]:
    """File name -> content for this rank's share of a checkpoint (rank 0 also writes the replicated files)."""
    own: dict[str, Any] = {}
    shared: dict[str, dict[str, Any]] = {}
    sharded: dict[str, Any] = {}
    for c in table:
        if c.sharded:
            sharded[shard_file(c.name, rank, prefix)] = parts[c.name]
            continue
        if not c.replicated:
            own[c.name] = parts[c.name]
            continue
        if c.per_rank_keys is not None:
            keys = c.per_rank_keys()
            own[c.name + PER_RANK_SUFFIX] = {k: v for k, v in parts[c.name].items() if k in keys}
        shared.setdefault(c.file, {})[c.name] = parts[c.name]
    out = {rank_file(rank, prefix): own, **sharded}
    for file, states in shared.items():
        if writes(rank, file):
            out[prefix + file] = next(iter(states.values())) if file in _SOLE_FILES else states
    return out


def load(table: Iterable[Component], path: Path, rank: int, prefix: str = "") -> dict[str, Any]:
    """Every component's saved state from checkpoint directory `path`, as this rank must restore it."""
    table = list(table)
    contents = {rank_file(rank, prefix): load_file(path / rank_file(rank, prefix))}
    for file in {c.file for c in table if c.replicated}:
        contents[prefix + file] = load_file(path / (prefix + file))
    states: dict[str, Any] = {}
    missing = []
    for c in table:
        if c.sharded:
            states[c.name] = _load_shard(path / shard_file(c.name, rank, prefix), c.name)
            continue
        content = contents[rank_file(rank, prefix) if not c.replicated else prefix + c.file]
        if c.file in _SOLE_FILES:
            state = dict(content)
        elif c.name in content:
            state = content[c.name]
        else:
            missing.append(c.name)
            continue
        if c.per_rank_keys is not None:
            state.update(contents[rank_file(rank, prefix)].get(c.name + PER_RANK_SUFFIX, {}))
        states[c.name] = state
    if missing:
        raise UsageError(
            f"The checkpoint {path} has no state for {', '.join(missing)}. It was written by a run with other state "
            "(extras, generators, devices, a scheduler or scaler); resume it with the same setup, or start a new run directory."
        )
    return states


def _load_shard(path: Path, name: str) -> Any:
    if not path.is_file():
        raise UsageError(
            f"The checkpoint {path.parent} has no shard file {path.name} for {name}: it was not written with {name} sharded "
            "(FSDP2) on this rank. Resume with the setup that wrote it (the same model wrapping and world size), or start a new "
            "run directory."
        )
    return load_file(path)
