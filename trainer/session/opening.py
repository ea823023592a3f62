"""How an attempt opens: the checkpoint it resumes and how (a replay from the checkpoint's replay base, or a restore of
the checkpoint itself), or a fresh start when there is none.

The choice is the same on every rank: the Resumer agrees on the checkpoint, and
whether it is replayed follows from its manifest and the run's length. A stop
checkpoint that holds only its replay base must be replayed; where this run
cannot replay it, the attempt is refused with the fix (`replay_needed`). This
module must never write a checkpoint or touch the trajectory: it only restores
and says where the attempt's own training starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from legato.errors import UsageError
from legato.session.position import Position
from legato.session.replayer import Replayer
from legato.session.resume import Resumer, replay_needed
from legato.session.saving import Saver
from legato.store.bases import held_by_replay, location

log = logging.getLogger(__name__)


def open_attempt(
    resumer: Resumer, saving: Saver, replayer: Replayer, position: Position, training: dict | None, total_steps: int, world_size: int
) -> tuple[dict | None, int]:
    """Collective: resume the newest usable checkpoint, or start fresh. Returns its manifest (None: fresh) and the step this
    attempt's own training starts at (the steps of a replay come before it)."""

    def restores_first(path: Path, manifest: dict) -> tuple[Path, str] | None:
        """What resuming checkpoint `path` loads first (a resume.Target): its replay base where it replays, the checkpoint
        itself otherwise; None where it restores resharded or this run cannot resume it."""
        if manifest["world_size"] != world_size:
            return None
        if saving.base.replayable(manifest, total_steps, world_size):
            return location(path, manifest)
        return None if held_by_replay(manifest) else (path, "")

    found = resumer.select(training, restores_first)
    if found is None:
        log.info("rank %d: no checkpoint under %s, starting at step 0", resumer.peers.rank, resumer.root)
        return None, 0
    path, manifest = found
    cannot = saving.base.unreplayable(manifest, total_steps) if held_by_replay(manifest) else None
    if cannot is not None and manifest["world_size"] == world_size:
        raise UsageError(replay_needed(path, manifest, *cannot))
    if saving.base.replayable(manifest, total_steps, world_size):
        replayer.start(path, manifest)
        saving.base.resumed(path, manifest, replayed=True, verified=replayer.base_restored)
        return manifest, manifest["step"]
    resumer.restore(path, manifest)
    # A resharded restore is not the checkpoint's files of this world size: the next replay base is written anew.
    resumed = resumer.resumed
    saving.base.resumed(path, manifest, replayed=False, verified=resumed is not None and resumed.match and resumed.resharded is None)
    # Resharded from a stop checkpoint's replay base: the run goes on from the base's step.
    saving.standing = manifest["step"] if held_by_replay(manifest) else 0
    return manifest, position.step
