"""The table of state components: what a Session saves, restores, hashes and plants faults in.

Each row names one component (the name is the digest name in manifests,
trajectories and `chaos.skip_restore`), the object holding it (a torch
`Stateful`: `state_dict()` / `load_state_dict()`), the checkpoint file it goes
to, and whether it is replicated (rank 0 writes the one copy), per rank, or
sharded (FSDP2: each rank writes its own shards, in a file of their own).
Save, restore, digest and the fault switches all iterate this table, so no
component can be saved and forgotten on restore. A replicated component may
name keys that differ per rank (batch-norm buffers: each rank's forward
updates its own); those also go to the rank's file and override on restore.

How the rows become files is legato.store.layout's. This module must never
touch the disk or the process group, and never draw from an RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from legato.errors import UsageError
from legato.state.file_names import RANK_FILE, SHARD_FILE
from legato.state.hashing import Digests, digest, rank_hash

if TYPE_CHECKING:
    # Only for the type: importing torch.distributed.checkpoint costs 2 s per rank on a busy CPU.
    from torch.distributed.checkpoint.stateful import Stateful


@dataclass(frozen=True)
class Component:
    """One row of the table: a named Stateful, the file it goes to, and how it is restored."""

    name: str
    obj: Stateful
    file: str = RANK_FILE
    per_rank_keys: Callable[[], set[str]] | None = None
    restore_last: bool = False  # RNG: restored after everything else, right before the first resumed step

    @property
    def replicated(self) -> bool:
        return self.file not in (RANK_FILE, SHARD_FILE)

    @property
    def sharded(self) -> bool:
        return self.file == SHARD_FILE


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


def restore(table: Iterable[Component], states: Mapping[str, Any], skips: Callable[[str], bool], last: bool, source: object) -> None:
    """Load the components of one phase (`last`: the RNG phase) from checkpoint `source`; `skips` leaves some unrestored
    (fault injection). The files verified before this: a state that does not load is another run's, named as such."""
    for c in table:
        if c.restore_last == last and not skips(c.name):
            try:
                c.obj.load_state_dict(states[c.name])
            except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
                raise UsageError(_does_not_fit(source, c, exc)) from exc


def _does_not_fit(source: object, c: Component, exc: Exception) -> str:
    said = " ".join(str(exc).split())
    said = said if len(said) <= 400 else said[:397] + "..."
    held = c.obj
    while hasattr(held, "obj"):  # legato's adapters (Shards, OptimizerState) hold the user's object as `obj`
        held = held.obj
    return (
        f"Checkpoint {source} does not fit this run's {c.name} ({type(held).__name__}): {type(exc).__name__}: {said} The run "
        "directory holds checkpoints of another model or setup. Resume it with the setup that wrote them, or start this one in "
        "a new run directory."
    )


def state_hash(table: Iterable[Component]) -> tuple[dict[str, str], str]:
    """This rank's component digests and rank hash, from the live objects (draws no RNG)."""
    components = digests(capture(table))
    return components, rank_hash(components)
