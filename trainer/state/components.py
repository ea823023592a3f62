"""The table of state components: what a Session saves, restores, hashes and plants faults in.

Each row names one component (the name is the digest name in manifests,
trajectories and `chaos.skip_restore`), the object holding it (a torch
`Stateful`: `state_dict()` / `load_state_dict()`), the checkpoint file it goes
to, and whether it is replicated (rank 0 writes the one copy) or per rank.
Save, restore, digest and the fault switches all iterate this table, so no
component can be saved and forgotten on restore. A replicated component may
name keys that differ per rank (batch-norm buffers: each rank's forward
updates its own); those also go to the rank's file and override on restore.

File layout inside a checkpoint directory (`prefix` "" for the checkpoint
itself; the replay base uses the same layout under `replay_`):
`model.pt` (the model's state dict alone), `train_state.pt` (name -> state of
the other replicated components), `rank<R>.pt` (name -> state of the per-rank
components, plus `<name>_buffers` for the per-rank keys of replicated ones).
This module must never draw from an RNG or touch the process group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legato.errors import UsageError
from legato.state.hashing import Digests, digest
from legato.store import checkpoint as ckpt

if TYPE_CHECKING:
    # Only for the type: importing torch.distributed.checkpoint costs 2 s per rank on a busy CPU.
    from torch.distributed.checkpoint.stateful import Stateful

MODEL_FILE = "model.pt"
TRAIN_STATE_FILE = "train_state.pt"
RANK_FILE = "rank"  # stands for rank<R>.pt
PER_RANK_SUFFIX = "_buffers"
_SOLE_FILES = (MODEL_FILE,)  # files that hold one component's state dict as is (readable without legato)


@dataclass(frozen=True)
class Component:
    name: str
    obj: Stateful
    file: str = RANK_FILE
    per_rank_keys: Callable[[], set[str]] | None = None
    restore_last: bool = False  # RNG: restored after everything else, right before the first resumed step

    @property
    def replicated(self) -> bool:
        return self.file != RANK_FILE


def check_stateful(name: str, obj: Any) -> None:
    """Refuse an object that is not a torch `Stateful` (checked by shape, as the protocol is structural)."""
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise UsageError(
            f"Session state {name!r} is a {type(obj).__name__}, which has no state_dict()/load_state_dict(). "
            "Pass objects with both methods (torch's Stateful protocol), or wrap the value in one."
        )


def capture(table: Iterable[Component]) -> dict[str, Any]:
    """Every component's current state (live references: copy before the objects move on)."""
    return {c.name: c.obj.state_dict() for c in table}


def digests(parts: Mapping[str, Any], seen: Digests | None = None) -> dict[str, str]:
    """Every component's digest; `seen` keeps the tensor digests of this pass for the checkpoint writer."""
    seen = seen if seen is not None else Digests()
    return {name: digest(value, seen) for name, value in parts.items()}


def rank_file(rank: int, prefix: str = "") -> str:
    return f"{prefix}rank{rank}.pt"


def files(table: Iterable[Component], parts: Mapping[str, Any], rank: int, prefix: str = "") -> dict[str, Any]:
    """File name -> content for this rank's share of a checkpoint (rank 0 also writes the replicated files)."""
    own: dict[str, Any] = {}
    shared: dict[str, dict[str, Any]] = {}
    for c in table:
        if not c.replicated:
            own[c.name] = parts[c.name]
            continue
        if c.per_rank_keys is not None:
            keys = c.per_rank_keys()
            own[c.name + PER_RANK_SUFFIX] = {k: v for k, v in parts[c.name].items() if k in keys}
        shared.setdefault(c.file, {})[c.name] = parts[c.name]
    out = {rank_file(rank, prefix): own}
    if rank == 0:
        for file, states in shared.items():
            out[prefix + file] = next(iter(states.values())) if file in _SOLE_FILES else states
    return out


def load(table: Iterable[Component], path: Path, rank: int, prefix: str = "") -> dict[str, Any]:
    """Every component's saved state from checkpoint directory `path`, as this rank must restore it."""
    table = list(table)
    contents = {rank_file(rank, prefix): ckpt.load_file(path / rank_file(rank, prefix))}
    for file in {c.file for c in table if c.replicated}:
        contents[prefix + file] = ckpt.load_file(path / (prefix + file))
    states: dict[str, Any] = {}
    missing = []
    for c in table:
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


def restore(table: Iterable[Component], states: Mapping[str, Any], skips: Callable[[str], bool], last: bool) -> None:
    """Load the components of one phase (`last`: the RNG phase); `skips` leaves some unrestored (fault injection)."""
    for c in table:
        if c.restore_last == last and not skips(c.name):
            c.obj.load_state_dict(states[c.name])
