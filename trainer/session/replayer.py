"""Replaying a resume: restore the replay base, check the re-run steps, and give the verdict.

A checkpoint at step N carries a base B; the resume restores B, the user's own
loop runs steps B+1..N again, each step's record is checked against the one
saved (legato.session.replay), and at N the ranks' reports become one verdict,
concluded like any resume (legato.session.resume). Going on unverified
(checkpoint.verify: warn, or LEGATO_RESUME=unverified), a divergent replay
falls back to loading N itself; where N holds no state of its own (a stop
checkpoint held by its replay), warn refuses and LEGATO_RESUME=unverified goes
on from the replayed state. This module must
never call back into the Session, and never write a checkpoint or trajectory.
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from pathlib import Path

from legato.dist.stop import Decision, StopFlag
from legato.events import Kind
from legato.session import replay
from legato.session.resume import Resumer
from legato.state import components as table
from legato.state.hashing import global_hash
from legato.store.bases import held_by_replay, location
from legato.store.manifest_schema import UNREGISTERED_KEY

log = logging.getLogger(__name__)


class Outcome(Enum):
    """What a replayed step led to."""

    RUNNING = "running"
    VERIFIED = "verified"  # the last replayed step: concluded (verified, or refused/warned)
    FELL_BACK = "fell_back"  # divergent under verify: warn, checkpoint N loaded instead
    STOPPED = "stopped"  # the ranks agreed to stop during the replay


class Replayer:
    """One rank's replay of the steps between a checkpoint's replay base and the checkpoint."""

    def __init__(self, resumer: Resumer, flag: StopFlag) -> None:
        self.resumer, self.flag = resumer, flag
        self.check: replay.ReplayCheck | None = None
        self.base_restored = False  # agreed: every rank's base restored to its recorded digests
        self._target: tuple[Path, dict] | None = None
        self._started = 0.0  # when the replayed steps began

    @property
    def active(self) -> bool:
        """Whether replayed steps are running."""
        return self.check is not None

    def start(self, path: Path, manifest: dict) -> None:
        """Restore the replay base B of checkpoint N; the loop then runs steps B+1..N again."""
        base, rank = manifest["replay"], self.resumer.peers.rank
        self.resumer.carry_marks(manifest)  # what the run found unsaved so far informs the replay's verdict
        self.resumer.load(*location(path, manifest))
        unrestored, _ = self.resumer.check(base["ranks"])
        self.base_restored = not unrestored
        self.resumer.chaos.consume_rng(self.resumer.components)
        mine = base["ranks"][rank]
        self.check = replay.ReplayCheck(rank, base["from_step"], manifest["step"], mine["steps"], unrestored.get(rank, []))
        self._target = (path, manifest)
        self._started = time.perf_counter()
        step = self.resumer.feed.position.step
        log.info("rank %d: replaying steps %d..%d from the replay base in %s", rank, step + 1, manifest["step"], path)

    def at_end(self, step: int) -> bool:
        """Whether `step` is the checkpoint's: judged, not voted on (the checkpoint at it stands either way)."""
        return self.check is not None and step == self.check.to_step

    def step(self, step: int, record: dict | None, held_at: int | None, decision: Decision) -> Outcome:
        """Check replayed step `step` and act on what the ranks agreed after it (`decision`); at the checkpoint's step,
        judge the replay."""
        assert self.check is not None and record is not None
        self.check.check(record)
        if self.at_end(step):
            return self._finish(held_at)
        if not decision.stop:
            return Outcome.RUNNING
        telemetry, rank = self.resumer.telemetry, self.resumer.peers.rank
        telemetry.stop_agreed(step, self.flag.received_at)
        telemetry.emit(Kind.REPLAY_STOPPED, step=step, checkpoint_step=self.check.to_step)
        telemetry.say(
            "rank %d: ranks agreed to stop during the replay, after step %d; the checkpoint at step %d still stands; "
            "run the same command again to resume",
            rank,
            step,
            self.check.to_step,
        )
        return Outcome.STOPPED

    def _finish(self, held_at: int | None) -> Outcome:
        assert self.check is not None and self._target is not None
        check, (path, manifest) = self.check, self._target
        self.check, self._target = None, None
        r = self.resumer
        components, own_hash = table.state_hash(r.components)
        saved = manifest["ranks"][r.peers.rank]["components"]
        check.report.differing = sorted(n for n in set(saved) | set(components) if saved.get(n) != components.get(n))
        check.report.held_at = held_at
        reports = r.peers.gather((own_hash, check.report))
        verdict = replay.judge(
            check.from_step,
            check.to_step,
            [rep for _, rep in reports],
            loader=r.feed.source is not None,
            unregistered=r.carried.get(UNREGISTERED_KEY),
        )
        verdict.seconds = round(time.perf_counter() - self._started, 3)
        recomputed = global_hash([h for h, _ in reports])
        unrestored = {rep.rank: rep.unrestored for _, rep in reports if rep.unrestored}
        # Going on from a divergent replay loads N's own state, where N has one (else going on keeps the replayed state).
        if verdict.identical or held_by_replay(manifest) or r.going_on(manifest) is None:
            r.conclude(path, manifest, recomputed, unrestored, verdict)
            return Outcome.VERIFIED
        log.warning(
            "rank %d: %s. Loading checkpoint %s instead, to go on unverified from its saved state.",
            r.peers.rank,
            replay.describe(verdict),
            path,
        )
        r.load(path)
        mismatches, recomputed = r.check(manifest["ranks"])
        for rank, names in unrestored.items():
            mismatches[rank] = sorted(set(mismatches.get(rank, [])) | set(names))
        r.conclude(path, manifest, recomputed, mismatches, verdict)
        r.chaos.consume_rng(r.components)
        return Outcome.FELL_BACK
