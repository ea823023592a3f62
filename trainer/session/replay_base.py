"""The replay base of one rank: the state a resume replays from, the record of every step since it, and which bases
are on disk already.

Every `replay_steps` steps (fewer often when the copies would cost more than `replay_cost`), and when the ranks agreed
that the base is older than its time bound (legato.session.base_clock), the state is copied into the base (a Snapshot)
and each later step appends its record (fingerprints of a GPU batch or gradients held on the device until a share reads
them back), so that every checkpoint carries its own proof. A base is written once: a checkpoint whose base is already
on disk (the newest checkpoint's own state, or the base it wrote or refers to) refers to those files instead
(legato.store.bases), and a final checkpoint, never replayed, has none. This module must never write a checkpoint,
take part in a vote or restore anything: legato.session.saving decides when a base is taken and which checkpoint
carries it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from legato.config import CheckpointSection
from legato.dist.stop import Decision
from legato.paths import STEP_PREFIX
from legato.session import replay
from legato.session.base_clock import BaseClock, bound_seconds
from legato.session.losses import Loss
from legato.session.wrappers import unwrap
from legato.state.sharded import local
from legato.state.snapshot import Snapshot, batch_tensors
from legato.store import bases

# Where a base is on disk: [checkpoint directory name, file prefix] ("" for a checkpoint's own state).
Place = list[str]


class ReplayBase:
    """The base snapshot, the records of the steps since it, and the bases on disk, for one rank."""

    def __init__(self, policy: CheckpointSection, rank: int) -> None:
        self.rank = rank
        self.snapshot = Snapshot() if policy.replay_steps else None
        self.every = policy.replay_steps
        self.window: list[dict] = []
        self.clock = BaseClock(
            bound_seconds(policy.replay_seconds, policy.every_minutes) if self.snapshot is not None else 0.0, cost=policy.replay_cost
        )
        self.held = replay.HeldBatches()
        self._agreed = False  # the ranks agreed at this step's boundary that the base is too old
        self._batch_fingerprint: replay.Fingerprint | None = None
        # The window's fingerprints still on their device (legato.session.replay.HeldFingerprint): how many, and the bytes
        # of their copies; the window is read back before either passes its bound.
        self._held, self._held_bytes = 0, 0
        # Base states on disk, step -> place: the newest checkpoint's own state and its base, both kept from pruning
        # while it is the newest. A snapshot found here is referred to, never written again.
        self.on_disk: dict[int, Place] = {}
        self._on_disk_after: dict[int, dict[int, Place]] = {}  # checkpoint step -> `on_disk` once it is committed

    @property
    def on(self) -> bool:
        return self.snapshot is not None

    @property
    def step(self) -> int | None:
        """The step the base holds (None before the first)."""
        return self.snapshot.step if self.snapshot is not None else None

    def yielded(self, batch: Any) -> None:
        """The batch about to be trained on: fingerprint it for this step's record."""
        if self.snapshot is None:
            return
        tensors = batch_tensors(batch)
        fingerprint = self._batch_fingerprint = replay.take_fingerprint(tensors) if tensors else replay.NO_TENSORS
        self.held.yielded(tensors)
        if isinstance(fingerprint, replay.HeldFingerprint):
            self._holding(fingerprint)

    def settle(self) -> None:
        """Read back the fingerprints held on their device, into the window's records (before they are saved)."""
        if self._held:
            for record in self.window:
                replay.settle_record(record)
            self._held, self._held_bytes = 0, 0

    def _holding(self, fingerprint: replay.HeldFingerprint) -> None:
        """Count a held fingerprint whose record joins the window at this step's end, the window's read back first when
        its copies are at their bound."""
        if self._held >= replay.HELD_STEPS or self._held_bytes >= replay.HELD_BYTES:
            self.settle()
        self._held += 1
        self._held_bytes += fingerprint.nbytes

    def record_step(self, step: int, loss: Loss | None, model: torch.nn.Module) -> dict | None:
        """This step's replay record (the gradients' fingerprint, of the model inside its wrappers, only on the first
        step past the base)."""
        if self.snapshot is None:
            return None
        first_after_base = step == (self.snapshot.step or 0) + 1
        # A DTensor gradient (FSDP2) is fingerprinted by this rank's shard: no collective, no gather.
        grads = replay.take_fingerprint([local(p.grad) for p in unwrap(model).parameters()]) if first_after_base else None
        if isinstance(grads, replay.HeldFingerprint):
            self._holding(grads)
        record = replay.step_record(step, loss, self._batch_fingerprint, grads)
        self.held.step_ended(step)
        self.window.append(record)
        return record

    def take(self, step: int, parts: dict[str, Any], files: dict[str, Any], replicated: set[str]) -> None:
        """Make `parts` (this rank's `files` of the live state, `replicated` among them) the base at `step`."""
        assert self.snapshot is not None
        self._started()
        self.snapshot.take(step, parts, files, replicated)

    def adopt(self, staged: Snapshot) -> Snapshot:
        """Make an already staged copy of this step's state the base (one copy, not two); the old base's buffer, returned,
        is free for the next staging."""
        assert self.snapshot is not None
        self._started()
        old, self.snapshot = self.snapshot, staged
        return old

    def _started(self) -> None:
        self.window = []
        self._held, self._held_bytes = 0, 0
        self._agreed = False
        self.clock.taken()

    def due(self, step: int, total_steps: int) -> bool:
        """Whether `step` starts a new base (every replay_steps steps once the agreed spacing has passed, or when the ranks
        agreed the base is too old; short of the end)."""
        if self.snapshot is None or step >= total_steps:
            return False
        spaced = step - (self.snapshot.step or 0) >= self.clock.spacing
        return (step % self.every == 0 and spaced) or self._agreed

    def agreed(self, decision: Decision) -> None:
        """This boundary's decision: whether the ranks agreed that the base is too old."""
        # Most boundaries agree on nothing: answered without the clock's rule.
        self._agreed = decision.base_due and self.snapshot is not None and BaseClock.agreed(decision, self.snapshot.step)

    def replayable(self, manifest: dict, total_steps: int, world_size: int) -> bool:
        """Whether a resume from `manifest` proves itself by a replay."""
        same_world = manifest["world_size"] == world_size
        return self.snapshot is not None and "replay" in manifest and manifest["step"] < total_steps and same_world

    def unreplayable(self, manifest: dict, total_steps: int) -> tuple[str, str] | None:
        """Why this run cannot replay `manifest`, whose state is held by its replay, and the fix; None when it can."""
        step = manifest["step"]
        if self.snapshot is None:
            return (
                "replay is off (replay_steps=0)",
                "Resume it with replay on (CheckpointPolicy(replay_steps=32), the default; config "
                "checkpoint.replay_steps), as in the run that wrote it; later checkpoints may turn it off again.",
            )
        if step >= total_steps:
            return (
                f"this run ends at step {total_steps}, so the replay could not reach step {step}",
                f"Resume it with more than {step} total steps (total_steps=, or the config's steps), as the run that wrote it had.",
            )
        return None

    def resumed(self, path: Path, manifest: dict, replayed: bool, verified: bool) -> None:
        """After a resume: the state restored (checkpoint `path`, or its replay base) is on disk, if it verified on every rank."""
        if not verified:
            self.on_disk = {}
        elif replayed:
            directory, prefix = bases.location(path, manifest)
            self.on_disk = {manifest["replay"]["from_step"]: [directory.name, prefix]}
        else:
            self.on_disk = {manifest["step"]: [path.name, ""]}

    def holds_the_state_of(self, step: int) -> bool:
        """Whether a checkpoint at `step` may hold no state of its own: the base is older, so its replay proves step."""
        return self.snapshot is not None and self.snapshot.step is not None and self.snapshot.step < step

    def for_checkpoint(self, step: int, reason: str, by_replay: bool = False) -> tuple[dict[str, Any], Place | None, bool]:
        """The base of the checkpoint due at `step`: this rank's files to write for it, where it is on disk already, and
        whether it has one. A final checkpoint has none (nothing resumes from it into a replay). `by_replay`: the
        checkpoint holds no state of its own, so only its base is on disk after it."""
        snap = self.snapshot
        own = f"{STEP_PREFIX}{step}"
        if reason == "final" or snap is None or snap.step is None or snap.step >= step:
            self._on_disk_after[step] = {step: [own, ""]}
            return {}, None, False
        at = self.on_disk.get(snap.step)
        mine = {} if by_replay else {step: [own, ""]}
        self._on_disk_after[step] = {**mine, snap.step: at or [own, bases.REPLAY_PREFIX]}
        if at is not None:
            return {}, at, True
        return {bases.REPLAY_PREFIX + name: content for name, content in snap.files.items()}, None, True

    def share(self, at: Place | None) -> dict:
        """This rank's replay share of a checkpoint now; `at` names where the base is on disk when it is already."""
        assert self.snapshot is not None
        self.settle()
        return _share(self.rank, self.snapshot, self.window, at)

    def deferred_share(self, at: Place | None) -> Callable[[], dict]:
        """The same share, built later (by a background writer) from the base and the records as they are now."""
        self.settle()  # here, on the thread and stream the batches were copied on
        snapshot, window, rank = self.snapshot, list(self.window), self.rank
        assert snapshot is not None
        return lambda: _share(rank, snapshot, window, at)

    def committed(self, step: int) -> None:
        """Checkpoint `step` was published: the bases on disk are the ones it wrote or refers to."""
        self.on_disk = self._on_disk_after.pop(step, {})
        self._on_disk_after = {later: after for later, after in self._on_disk_after.items() if later > step}


def _share(rank: int, snapshot: Snapshot, window: list[dict], at: Place | None) -> dict:
    found = replay.base_share(rank, snapshot, window)
    return found if at is None else {**found, bases.AT_KEY: at}
