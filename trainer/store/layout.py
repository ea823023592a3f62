"""Which file of a checkpoint holds which component, and which rank writes it.

Inside a checkpoint directory (`prefix` "" for the checkpoint itself; the
replay base uses the same layout under `replay_`): `model.pt` (the model's
state dict alone, readable without legato), `train_state.pt` (name -> state of
the other replicated components), `rank<R>.pt` (name -> state of the per-rank
components, plus `<name>_buffers` for the per-rank keys of replicated ones),
`<name>.shard<R>.pt` (rank R's shards of a sharded component, FSDP2's DTensors
as plain records: legato.state.sharded; every rank writes its own).

With more than one rank the replicated state is written once, spread over
every rank as DCP's deduplicating planner does: the tensors of
`train_state.pt` go to `shared<K>.pt` files, each tensor to the rank with the
fewest bytes so far (rank 0 starts with `model.pt`), and `train_state.pt`
keeps a marker `("legato.share", K, I)` in each one's place. Every rank computes
the same plan from the same shapes, writes and hashes only its share, and on
restore reads every share back (in parallel threads). A rank's missing share
makes the checkpoint unverifiable, so the manifest reader falls back to an
older one. `writes` is the one decision of which rank writes which file. This
module must never know the Session or touch the process group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from legato.errors import UsageError
from legato.state.components import Component
from legato.state.file_names import MODEL_FILE, RANK_FILE, SHARD_FILE, TRAIN_STATE_FILE
from legato.state.trees import DESCEND, leaves, rebuilt
from legato.store.filehash import load_file
from legato.system.io_threads import io_map

PER_RANK_SUFFIX = "_buffers"
_SOLE_FILES = (MODEL_FILE,)  # files that hold one component's state dict as is (readable without legato)
# Files whose state a restore only copies into live tensors (nn.Module.load_state_dict keeps none of the tensors it is
# handed): read straight from the file's mapping, without a copy of their own (256 MiB resume, 2 ranks: load 0.16 -> 0.11 s).
_COPIED_IN = (MODEL_FILE,)
WRITER_OF_REPLICATED = 0  # replicated state is identical on every rank: rank 0 writes what is not spread
SHARE_PREFIX = "shared"
SHARE_MARK = "legato.share"
SPREAD_MIN_BYTES = 4096  # smaller tensors stay in train_state.pt: a marker would cost more than it spreads


def writes(rank: int, file: str) -> bool:
    """Whether rank `rank` writes `file` (a component's file: RANK_FILE or SHARD_FILE for its own, `shared<K>.pt` for rank K's
    share, else a replicated one, which rank 0 writes)."""
    if file in (RANK_FILE, SHARD_FILE):
        return True
    share = _share_index(file)
    return rank == (WRITER_OF_REPLICATED if share is None else share)


def rank_file(rank: int, prefix: str = "") -> str:
    """The name of rank `rank`'s own file."""
    return f"{prefix}rank{rank}.pt"


def shard_file(name: str, rank: int, prefix: str = "") -> str:
    """The name of rank `rank`'s file of the sharded component `name`."""
    return f"{prefix}{name}.shard{rank}.pt"


def share_file(rank: int, prefix: str = "") -> str:
    """The name of the file holding rank `rank`'s share of the replicated tensors."""
    return f"{prefix}{SHARE_PREFIX}{rank}.pt"


def for_everyone(files: Iterable[str], rank: int) -> set[str]:
    """Which of rank `rank`'s files (unprefixed) hold replicated state, written once for every rank: all but its own
    file and its shard files."""
    return {f for f in files if f != rank_file(rank) and not f.endswith(f".shard{rank}.pt")}


def _share_index(file: str) -> int | None:
    suffix = file.removeprefix(SHARE_PREFIX).removesuffix(".pt")
    return int(suffix) if file.startswith(SHARE_PREFIX) and file.endswith(".pt") and suffix.isdigit() else None


def files(table: Iterable[Component], parts: Mapping[str, Any], rank: int, prefix: str = "", world_size: int = 1) -> dict[str, Any]:
    """File name -> content for this rank's share of a checkpoint."""
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
    contents = {file: next(iter(states.values())) if file in _SOLE_FILES else states for file, states in shared.items()}
    if world_size > 1:
        preload = sum(_nbytes(contents[f]) for f in _SOLE_FILES if f in contents)
        spread, shares = _spread({f: c for f, c in contents.items() if f not in _SOLE_FILES}, world_size, preload)
        contents.update(spread)
        contents[share_file(rank)] = shares[rank]
    out = {rank_file(rank, prefix): own, **sharded}
    out.update({prefix + file: content for file, content in contents.items() if writes(rank, file)})
    return out


def _nbytes(tree: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(tree))


def _tensors(tree: Any) -> Iterable[torch.Tensor]:
    return (leaf for leaf in leaves(tree) if isinstance(leaf, torch.Tensor))


def _spread(contents: dict[str, Any], world_size: int, preload: int) -> tuple[dict[str, Any], list[dict[int, torch.Tensor]]]:
    """Each file's content with its big tensors replaced by markers, and each rank's share {index: tensor}.

    The plan depends only on the order and sizes of the tensors, identical on every rank for replicated state.
    """
    big = [t for content in contents.values() for t in _tensors(content) if _nbytes(t) >= SPREAD_MIN_BYTES]
    loads = [preload] + [0] * (world_size - 1)
    owner: dict[int, tuple[int, int]] = {}  # id(tensor) -> (rank, index)
    for index in sorted(range(len(big)), key=lambda i: (-_nbytes(big[i]), i)):
        if id(big[index]) in owner:
            continue  # one tensor reached twice: one copy, restored as one object
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += _nbytes(big[index])
        owner[id(big[index])] = (rank, index)
    shares: list[dict[int, torch.Tensor]] = [{} for _ in range(world_size)]

    def mark(node: Any, _: str | None) -> Any:
        if not (isinstance(node, torch.Tensor) and id(node) in owner):
            return DESCEND
        rank, index = owner[id(node)]
        shares[rank][index] = node
        return (SHARE_MARK, rank, index)

    return {file: rebuilt(content, mark) for file, content in contents.items()}, shares


def _is_mark(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 3 and value[0] == SHARE_MARK


def _fill(tree: Any, shares: Mapping[int, Mapping[int, torch.Tensor]], where: Path) -> Any:
    """`tree` with every marker replaced by its tensor from the shares read back."""

    def tensor(node: Any, _: str | None) -> Any:
        if not _is_mark(node):
            return DESCEND
        _, rank, index = node
        if rank not in shares or index not in shares[rank]:
            raise UsageError(
                f"The checkpoint {where} lacks rank {rank}'s share ({share_file(rank)}) of the replicated state; "
                "resume from another checkpoint (move this one away)."
            )
        return shares[rank][index]

    return rebuilt(tree, tensor)


def load(table: Iterable[Component], path: Path, rank: int, prefix: str = "") -> dict[str, Any]:
    """Every component's saved state from checkpoint directory `path`, as this rank must restore it."""
    table = list(table)
    names = [rank_file(rank, prefix), *sorted({prefix + c.file for c in table if c.replicated})]
    globbed = sorted(p.name for p in path.glob(f"{prefix}{SHARE_PREFIX}*.pt"))
    share_of = {name: share for name in globbed if (share := _share_index(name[len(prefix) :])) is not None}
    share_names = list(share_of)
    # The files are read in parallel: torch.load spends most of its time in reads and copies that release the GIL.
    loaded = dict(zip([*names, *share_names], io_map(lambda name: _load(path, name, prefix), [*names, *share_names])))
    shares = {share_of[name]: loaded.pop(name) for name in share_names}
    contents = {name: _fill(loaded[name], shares, path) if shares else loaded[name] for name in names}
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
        elif c.name in contents.get(prefix + TRAIN_STATE_FILE, {}):
            state = contents[prefix + TRAIN_STATE_FILE][c.name]  # saved once for all ranks by an older legato (a scheduler)
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


def _load(path: Path, name: str, prefix: str) -> Any:
    return load_file(path / name, own=name.removeprefix(prefix) not in _COPIED_IN)


def _load_shard(path: Path, name: str) -> Any:
    if not path.is_file():
        raise UsageError(
            f"The checkpoint {path.parent} has no shard file {path.name} for {name}: it was not written with {name} sharded "
            "(FSDP2) on this rank. Resume with the setup that wrote it (the same model wrapping and world size), or start a new "
            "run directory."
        )
    return load_file(path)
