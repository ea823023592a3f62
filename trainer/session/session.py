"""The exact-resume session: the public API around a user's own DDP loop.

    session = Session(run_dir, model=ddp, optimizer=opt, loader=loader, total_steps=1000, scheduler=sched)
    for batch in session:
        loss = step(batch)
        session.report(loss)
    sys.exit(session.exit_code)

or, keeping the loop's epochs: `for epoch in session.epochs(): for batch in
session.batches(): ...`. The loader is the user's own (legato.state.loaders adopts
it without changing its order, or refuses it before training), legato's
`resumable_loader()`, or none at all (the loop draws its own batches and
iterating yields the step index; `carry()` registers a prefetched batch).

Iterating restores the newest verified checkpoint (model, optimizer and loader
state first, RNG last, then the state hash is recomputed on every rank and
checked against the manifest), yields batches from the exact data position,
and after each step logs the trajectory, takes part in the agreed stop and
writes barrier checkpoints. The stop handler is installed when the Session is
created. All state goes through one table of components
(legato.state.components). With `replay_steps` K > 0 every checkpoint also carries
a replay base at most K steps back, and a resume restores that base and runs
the steps up to the checkpoint again through the user's loop, comparing loss
bits and digests (legato.session.replay), which proves the resume on the run itself.
The session never reaches into the orchestrator; it reports what happens
through plain-dict events.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from legato.dist.reduction import Pinning, pin_bucket_layout
from legato.dist.stop import StopAgreement, StopFlag, agree_at_start, parse_signal
from legato.errors import EXIT_OK, EXIT_STOPPED, ResumeMismatchError, UsageError
from legato.paths import RunPaths
from legato.session import replay
from legato.session.voice import say
from legato.state import components as table
from legato.state import loaders, rng
from legato.state.components import Component
from legato.state.hashing import Digests, global_hash, rank_hash
from legato.state.owned import Carried, Gradients, ShardedOptimizer, as_stateful, is_rng, is_sharded
from legato.state.sampler import ResumableDistributedSampler, worker_init
from legato.store import checkpoint as ckpt
from legato.store import layout
from legato.store.async_checkpoint import AsyncCheckpointer, Job
from legato.store.manifest import RunShape, newest_usable
from legato.store.trajectory import TrajectoryWriter

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 1.0


@dataclass(frozen=True)
class CheckpointPolicy:
    every_steps: int = 0
    every_minutes: float = 0.0
    keep_last: int = 3
    verify: str = "error"  # "error" or "warn" on a resume whose state hash does not match
    hash_every_steps: int = 10
    agree_every_steps: int = 0  # 0: agree about once a second, whatever the step time
    replay_steps: int = 32  # K: keep a replay base at most K steps back and replay it on resume; 0 for off (default: see docs/benchmarks.md)
    # Periodic checkpoints written in the background (legato.store.async_checkpoint). None: on when the model lives on a
    # GPU, where the device-to-pinned-host copy blocks about 0.01x a synchronous write (docs/gpu.md), off on the CPU,
    # where the two measured a tie end to end (docs/benchmarks.md) and the copy would only cost host memory.
    async_: bool | None = None


@dataclass(frozen=True)
class StopPolicy:
    signals: tuple[str, ...] = ("USR2",)


CHAOS_AT_ENV = "LEGATO_CHAOS_SIGNAL_AT"
CHAOS_RANK_ENV = "LEGATO_CHAOS_SIGNAL_RANK"


@dataclass(frozen=True)
class Chaos:
    """Fault injection for tests and demos; all off by default."""

    signal_rank: int = 0
    signal_at_steps: tuple[int, ...] = ()
    skip_restore: frozenset[str] = frozenset()
    kill: ckpt.KillPoint | None = None
    consume_rng_after_restore: tuple[str, ...] = ()
    step_sleep_s: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Chaos:
        """Stops planted from outside an unmodified script: LEGATO_CHAOS_SIGNAL_AT="13,26", LEGATO_CHAOS_SIGNAL_RANK="1"."""
        at, rank = environ.get(CHAOS_AT_ENV, "").strip(), environ.get(CHAOS_RANK_ENV, "0").strip()
        try:
            steps = tuple(int(s) for s in at.split(",") if s.strip())
            signal_rank = int(rank)
        except ValueError:
            raise UsageError(
                f"{CHAOS_AT_ENV}={at[:40]!r} / {CHAOS_RANK_ENV}={rank[:40]!r}: expected comma-separated step numbers and one rank "
                f"number, such as {CHAOS_AT_ENV}=13,26 {CHAOS_RANK_ENV}=1. Fix or unset them."
            ) from None
        return cls(signal_rank=signal_rank, signal_at_steps=steps)

    def skips(self, component: str) -> bool:
        """Whether to leave `component` unrestored; short names (numpy, loader, cuda) name RNG components."""
        short = component.removeprefix("rng.").removeprefix("gen.")
        return component in self.skip_restore or short in self.skip_restore or (short.startswith("cuda") and "cuda" in self.skip_restore)

    def consumes(self, component: str) -> bool:
        """Whether to draw from RNG `component` right after the restore (python, numpy, torch)."""
        return component.startswith("rng.") and component.removeprefix("rng.") in self.consume_rng_after_restore


@dataclass
class Resumed:
    step: int
    path: Path
    expected_hash: str
    recomputed_hash: str
    mismatches: dict[int, list[str]] = field(default_factory=dict)
    replay: replay.Verdict | None = None

    @property
    def match(self) -> bool:
        return not self.mismatches and (self.replay is None or self.replay.identical)


def resumable_loader(
    dataset: Any, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1, num_workers: int = 0, shuffle: bool = True, **kwargs: Any
) -> DataLoader:
    """A DataLoader whose position the Session can save and restore exactly."""
    sampler = ResumableDistributedSampler(len(dataset), rank, world_size, seed, shuffle=shuffle)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        worker_init_fn=worker_init if num_workers else None,
        generator=torch.Generator(),
        persistent_workers=False,
        **kwargs,
    )


class Session:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Any = None,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        scheduler: Stateful | None = None,
        scaler: Stateful | None = None,
        extras: Mapping[str, Stateful] | None = None,
        checkpoint: CheckpointPolicy = CheckpointPolicy(),
        stop: StopPolicy = StopPolicy(),
        chaos: Chaos | None = None,
        training: dict | None = None,
        on_event: Callable[[dict], None] | None = None,
        worker_rng: bool = True,
    ) -> None:
        self.source = loaders.adopt(loader, worker_rng)
        self.run_dir = Path(run_dir)
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.steps_per_epoch = None if self.source is None else self.source.steps_per_epoch
        self.total_steps = _total_steps(total_steps, total_epochs, self.steps_per_epoch)
        self.scheduler = scheduler
        self.scaler = scaler
        self.extras = {name: as_stateful(f"extra.{name}", obj) for name, obj in (extras or {}).items()}
        self.policy = checkpoint
        # Without chaos from the caller, stops may be planted through the environment (tests, `legato verify --command`).
        self.chaos = chaos if chaos is not None else Chaos.from_env()
        # Stops planted from the environment land right after their step: the ranks agree at every step then.
        agree_every = 1 if chaos is None and self.chaos.signal_at_steps and not checkpoint.agree_every_steps else checkpoint.agree_every_steps
        self.training = training
        self.on_event = on_event or (lambda event: None)
        self.carried = Carried()

        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        # Control traffic gets its own gloo group: CPU tensors, and no interleaving with DDP's buckets.
        self.group = dist.new_group(backend="gloo") if distributed else None
        self.generators = {} if self.source is None else dict(self.source.generators)
        self.components = self._component_table()

        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.metrics = {"loss_sum": 0.0, "loss_count": 0}
        self.stopped = False
        self.resumed: Resumed | None = None
        self.last_checkpoint: ckpt.Committed | None = None

        self._agreement = StopAgreement(self.group, agree_every)
        self._batches: Iterator | None = None
        self._loss: float | None = None
        self._lr: float | None = None
        self._last_save_time = time.monotonic()
        self._last_progress_time = 0.0
        self._trajectory: TrajectoryWriter | None = None
        # Replay: the base snapshot, the records of the steps since it, and the check while replaying.
        self._snapshot = replay.Snapshot() if checkpoint.replay_steps else None
        self._window: list[dict] = []
        self._held = replay.HeldBatches()
        self._batch_fingerprint: str | None = None
        self._replay: replay.ReplayCheck | None = None
        self._resuming: tuple[Path, dict] | None = None
        self._async = AsyncCheckpointer(self.checkpoint_root, self.rank, self.world_size, self.group, checkpoint.keep_last, self.chaos.kill) if _async_wanted(checkpoint, model) else None
        self._begun = False
        self._epoch_mode = False
        self._flag = StopFlag(tuple(parse_signal(s) for s in stop.signals))
        # Installed now, not when the loop starts: a stop signal before the loop is kept, and honoured before the first step.
        self._flag.install()

    # -- the loop -------------------------------------------------------

    @property
    def exit_code(self) -> int:
        return EXIT_STOPPED if self.stopped else EXIT_OK

    @property
    def checkpoint_root(self) -> Path:
        return RunPaths(self.run_dir).checkpoints

    @property
    def replaying(self) -> bool:
        """True while the steps of a resume's replay run (they write no trajectory and no checkpoint)."""
        return self._replay is not None

    def __iter__(self) -> Iterator[Any]:
        """Yields each step's batch (with no loader: the index of the step about to run), across epochs."""
        try:
            self._begin()
            yield from self._steps()
        finally:
            self._close()

    def epochs(self) -> Iterator[int]:
        """Yields each epoch number, resumed ones included; the body iterates `batches()` and may validate after it.

        A resume lands where the run stopped: in the middle of an epoch's batches, or after its last batch and
        before what the body does after it (validation, a per-epoch scheduler step), which then runs again.
        """
        self._epoch_mode = True
        try:
            self._begin()
            while self.step < self.total_steps and not self.stopped:
                yield self.epoch
                if self.stopped:
                    break
                self.epoch, self.step_in_epoch, self._batches = self.epoch + 1, 0, None
        finally:
            self._close()

    def batches(self, loader: Any = None) -> Iterator[Any]:
        """This epoch's batches from the session's loader, from where the run stands (inside `epochs()`)."""
        if not self._epoch_mode:
            raise UsageError("session.batches() runs inside `for epoch in session.epochs():`. Iterate the session itself for a loop without epochs.")
        if loader is not None and loader is not self.loader:
            raise UsageError("session.batches(loader) was given another loader than the Session's. Pass the Session the loader you iterate.")
        if self.source is None:
            raise UsageError("session.batches() needs a loader: pass loader= to the Session, or iterate the session itself.")
        yield from self._steps()

    def _steps(self) -> Iterator[Any]:
        while self.step < self.total_steps and not self.stopped and not self._epoch_over():
            batch = self._next_batch()
            if batch is _EPOCH_OVER:
                return
            self._loss = None
            self._lr = float(self.optimizer.param_groups[0]["lr"])
            if self._snapshot is not None:
                tensors = replay.batch_tensors(batch)
                self._batch_fingerprint = replay.fingerprint(tensors)
                self._held.yielded(tensors)
            yield batch
            self._end_step()

    def _epoch_over(self) -> bool:
        """In epochs(): whether this epoch's batches are all done (its length is known)."""
        return self._epoch_mode and self.steps_per_epoch is not None and self.step_in_epoch >= self.steps_per_epoch

    def report(self, loss: torch.Tensor | float) -> None:
        """Record this step's loss (exactly, as float.hex) and add it to the running accumulators."""
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self._loss = value
        self.metrics["loss_sum"] += value
        self.metrics["loss_count"] += 1

    def state_hash(self) -> tuple[dict[str, str], str]:
        """This rank's component digests and rank hash, from the live objects (draws no RNG)."""
        components = table.digests(table.capture(self.components))
        return components, rank_hash(components)

    # -- internals -------------------------------------------------------

    def _begin(self) -> None:
        self._begun = True
        if self.carried.used:
            # A batch carried before the loop: saved from now on, and restored into its tensors below.
            self.components.insert(next(i for i, c in enumerate(self.components) if c.name == "data"), Component(CARRIED, self.carried))
        found = self._select_checkpoint()
        resume_step = 0
        if found is None:
            log.info("rank %d: no checkpoint under %s, starting at step 0", self.rank, self.checkpoint_root)
        elif self._replayable(found[1]):
            resume_step = found[1]["step"]
            self._start_replay(*found)
        else:
            resume_step = found[1]["step"]
            self._restore(*found)
        # Before the first forward pass; chaos "buckets" leaves DDP's own layout on resume (fault injection).
        pinning = pin_bucket_layout(self.model) if found is None or not self.chaos.skips("buckets") else Pinning(False, "chaos: DDP's own layout")
        self.on_event({"event": "bucket_layout", "rank": self.rank, "step": self.step, "pinned": pinning.pinned, "reason": pinning.reason})
        self._trajectory = TrajectoryWriter(RunPaths(self.run_dir).trajectory(self.rank), resume_step)
        self._take_snapshot()
        if agree_at_start(self._flag, self.group):
            # A stop signal during start-up: stop before the first step; the newest checkpoint already holds this state.
            # Name the checkpoint's step, not a replay base's: it is where the next attempt starts.
            say(log, self.rank, "rank %d: stop signal during start-up; stopping at step %d without a new checkpoint", self.rank, resume_step)
            self.on_event({"event": "stop_agreed", "rank": self.rank, "step": resume_step, "signal_received_at": self._flag.received_at, "at_start": True})
            self.stopped = True

    def _replayable(self, manifest: dict) -> bool:
        return self._snapshot is not None and "replay" in manifest and manifest["step"] < self.total_steps

    def carry(self, batch: Any) -> Any:
        """Register the batch the loop holds into the next step (a prefetched batch) and return it unchanged.

        It is saved with every checkpoint; on a resume its tensors are overwritten in place with the saved ones.
        """
        if self._begun and not any(c.name == CARRIED for c in self.components):
            raise UsageError(
                "session.carry() was first called inside the loop, so the batch it holds is not in the checkpoints. "
                "Call it once before the loop too, with the first prefetched batch: X, Y = session.carry(get_batch())."
            )
        self.carried.hold(batch)
        return batch

    def _next_batch(self) -> Any:
        if self.source is None:
            return self.step
        if self._batches is None:
            self._batches = self._open_epoch(resuming=False)
        try:
            return next(self._batches)
        except StopIteration:
            # An epoch of unknown length ended: the next one starts where the plain loop starts it.
            if self.step_in_epoch == 0:
                raise UsageError(f"The loader yielded no batch in epoch {self.epoch}. Pass a loader that yields at least one batch per epoch.") from None
            if self._epoch_mode:
                self._batches = None
                return _EPOCH_OVER
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
            self._batches = self._open_epoch(resuming=False)
            return next(self._batches)

    def _open_epoch(self, resuming: bool) -> Iterator[Any]:
        assert self.source is not None
        return self.source.open(self.epoch, self.step_in_epoch, resuming)

    def _end_step(self) -> None:
        self.step += 1
        self.step_in_epoch += 1
        if self.steps_per_epoch is not None and self.step_in_epoch == self.steps_per_epoch:
            # In epochs() the epoch number moves on when the body is done (validation comes first); the
            # finished iterator goes now either way, as the plain loop's does, with its workers.
            self._batches = None
            if not self._epoch_mode:
                self.epoch += 1
                self.step_in_epoch = 0
        record = self._record_step() if self._snapshot is not None else None
        if self._replay is not None:
            self._replay_step(record)
        else:
            self._train_step_end()
        if self._snapshot is not None and self.step % self.policy.replay_steps == 0 and self.step < self.total_steps and not self.stopped:
            self._take_snapshot()

    def _train_step_end(self) -> None:
        if self.chaos.step_sleep_s:
            time.sleep(self.chaos.step_sleep_s)
        if self.rank == self.chaos.signal_rank and self.step in self.chaos.signal_at_steps:
            log.warning("chaos: rank %d sends itself %s after step %d", self.rank, self._flag.signals[0].name, self.step)
            os.kill(os.getpid(), self._flag.signals[0])
        reason = self._checkpoint_reason()
        hash_due = bool(self.policy.hash_every_steps) and self.step % self.policy.hash_every_steps == 0
        background = reason == "periodic" and self._async is not None
        if background and self._async.busy:
            self._committed(self._async.wait_for_previous(self.step), "periodic")
        # One pass over the state serves both the trajectory hash and the checkpoint.
        parts = table.capture(self.components) if reason or hash_due else {}
        seen = Digests()
        staged = self._stage(parts) if background else None
        components = (staged.digests() if hash_due else {}) if staged is not None else table.digests(parts, seen)
        self._record_trajectory(components if hash_due else None)
        self._report_progress()
        if reason == "signal":
            self.on_event({"event": "stop_agreed", "rank": self.rank, "step": self.step, "signal_received_at": self._flag.received_at})
            say(log, self.rank, "rank %d: ranks agreed to stop after step %d; run the same command again to resume", self.rank, self.step)
        if staged is not None:
            self._save_async(staged)
        elif reason is not None:
            if self._async is not None:
                self._committed(self._async.finish(), "periodic")
            self._save(reason, parts, components, seen)
        self.stopped = reason == "signal"

    def _checkpoint_reason(self) -> str | None:
        """Take part in this boundary's agreement; say why a checkpoint is due now, if one is."""
        clock_due = self.policy.every_minutes > 0 and time.monotonic() - self._last_save_time >= 60 * self.policy.every_minutes
        flags = self._async.flags() if self._async is not None else {}
        decision = self._agreement.boundary(self.step, self._flag.raised, clock_due, **flags)
        if self._async is not None:
            self._committed(self._async.settle(decision), "periodic")
        if self.step == self.total_steps:
            return "final"
        if decision.stop:
            return "signal"
        if decision.checkpoint_due or (self.policy.every_steps and self.step % self.policy.every_steps == 0):
            return "periodic"
        return None

    def _report_progress(self) -> None:
        """At most once a second (and at the last step), rank 0 tells the caller how far it got."""
        now = time.monotonic()
        if self.rank != 0 or (now - self._last_progress_time < PROGRESS_INTERVAL_S and self.step < self.total_steps):
            return
        self._last_progress_time = now
        self.on_event({"event": "progress", "rank": 0, "step": self.step, "total_steps": self.total_steps, "epoch": self.epoch, "loss": self._loss})

    def _record_trajectory(self, components: dict[str, str] | None) -> None:
        record = {"step": self.step, "epoch": self.epoch, "loss_hex": None if self._loss is None else self._loss.hex(), "lr": self._lr}
        if components is not None:
            record["state_hash"] = rank_hash(components)
            record["components"] = components
        assert self._trajectory is not None
        self._trajectory.write(record)

    def _component_table(self) -> list[Component]:
        """Every piece of state, in restore order: replicated by DDP (rank 0 writes it), or this rank's own."""
        module = _unwrap(self.model)
        rows = [
            # Buffers (batch-norm statistics) are updated by each rank's own forward after DDP's
            # broadcast, so they are per-rank state; parameters are replicated by the all-reduce.
            Component("model", module, table.MODEL_FILE, per_rank_keys=lambda: {name for name, _ in module.named_buffers()}),
            # A ZeroRedundancyOptimizer's state is sharded: each rank saves the shard it owns.
            Component("optimizer", ShardedOptimizer(self.optimizer)) if is_sharded(self.optimizer) else Component("optimizer", self.optimizer, table.TRAIN_STATE_FILE),
        ]
        if self.scheduler is not None:
            rows.append(Component("scheduler", self.scheduler, table.TRAIN_STATE_FILE))
        if self.scaler is not None:
            rows.append(Component("scaler", self.scaler, table.TRAIN_STATE_FILE))
        rows += [
            Component("counters", _Counters(self), table.TRAIN_STATE_FILE),
            Component("metrics", _Metrics(self)),
            Component("grads", Gradients(module)),
            *(Component(f"extra.{name}", obj, restore_last=is_rng(obj)) for name, obj in self.extras.items()),
            Component("data", _DataPosition(self)),
            *(Component(name, obj, restore_last=True) for name, obj in rng.components(self.generators).items()),
        ]
        return rows

    def _save(self, reason: str, parts: dict[str, Any], components: dict[str, str], seen: Digests) -> None:
        assert self._trajectory is not None
        self._trajectory.sync()
        files = layout.files(self.components, parts, self.rank)
        base = self._replay_share()
        if base is not None:
            files.update(layout.files(self.components, self._snapshot.parts, self.rank, prefix=REPLAY_PREFIX))
        seen_all = (seen,) if base is None else (seen, self._snapshot.seen)
        share = ckpt.RankShare(self.rank, files, components, rank_hash(components), replay=base, seen=seen_all)
        meta = {"reason": reason, "epoch": self.epoch, "training": self.training, "threads": torch.get_num_threads()}
        committed = ckpt.write_checkpoint(
            self.checkpoint_root, self.step, share, self.world_size, self.group, meta, self.policy.keep_last, self.chaos.kill
        )
        self._last_save_time = time.monotonic()
        log.info("rank %d: %s checkpoint step %d committed in %.3fs, global hash %s", self.rank, reason, self.step, committed.seconds, committed.global_hash)
        self._committed(committed, reason)

    def _stage(self, parts: dict[str, Any]) -> replay.Snapshot:
        """The blocking part of an asynchronous checkpoint: copy the state into the reused staging buffer."""
        assert self._async is not None and self._trajectory is not None
        self._trajectory.sync()
        return self._async.stage(self.step, parts)

    def _save_async(self, staged: replay.Snapshot) -> None:
        """Hand the staged state to the background writer; it is committed at a later agreed boundary."""
        assert self._async is not None
        snap, window = self._snapshot, list(self._window)
        has_base = snap is not None and snap.step is not None and snap.step < self.step
        rank = self.rank
        # The layout is built here, where the live module is (per-rank buffer names); it only refers to the copies.
        files = layout.files(self.components, staged.parts, rank)
        if has_base:
            files.update(layout.files(self.components, snap.parts, rank, prefix=REPLAY_PREFIX))

        def base() -> dict | None:
            return replay.base_share(rank, snap, window) if has_base else None

        meta = {"reason": "periodic", "epoch": self.epoch, "training": self.training, "threads": torch.get_num_threads()}
        holds = (staged, snap) if has_base else (staged,)
        self._async.start(Job(self.step, staged, files, base, meta, holds, staged.copy_s))
        self._last_save_time = time.monotonic()

    def _committed(self, committed: ckpt.Committed | None, reason: str) -> None:
        """Report a published checkpoint (rank 0 alone knows an asynchronous one's global hash)."""
        if committed is None or not committed.global_hash:
            return
        self.last_checkpoint = committed
        self.on_event(
            {
                "event": "checkpoint_committed",
                "rank": self.rank,
                "reason": reason,
                "step": committed.step,
                "global_hash": committed.global_hash,
                "seconds": committed.seconds,
                "bytes": committed.bytes,
            }
        )

    def _select_checkpoint(self) -> tuple[Path, dict] | None:
        """Rank 0 picks the newest verified checkpoint and hands its manifest to the others."""
        choice: list[Any] = [_pick(self.checkpoint_root, self.world_size, self.training) if self.rank == 0 else None]
        if self.group is not None:
            dist.broadcast_object_list(choice, src=0, group=self.group)
        picked = choice[0]
        if isinstance(picked, str):
            raise UsageError(picked)
        return None if picked is None else (Path(picked[0]), picked[1])

    def _restore(self, path: Path, manifest: dict) -> None:
        """Load checkpoint `path` itself, check its digests, and report the resume."""
        self._load(path)
        mismatches, recomputed = self._check_restore(manifest["ranks"])
        self._conclude(path, manifest, recomputed, mismatches)
        self._consume_rng()

    def _load(self, path: Path, prefix: str = "") -> None:
        states = layout.load(self.components, path, self.rank, prefix)
        table.restore(self.components, states, self.chaos.skips, last=False)
        # Mirror the uninterrupted run: it had this epoch's iterator open only mid-epoch.
        # At a boundary the loop opens it lazily, after the RNG restore, exactly as it did there.
        mid_epoch = self.step_in_epoch > 0 and (self.steps_per_epoch is None or self.step_in_epoch < self.steps_per_epoch)
        self._batches = self._open_epoch(resuming=True) if mid_epoch and self.source is not None else None
        # RNG goes last, right before the first resumed step: nothing may draw after it.
        table.restore(self.components, states, self.chaos.skips, last=True)

    # -- replay ------------------------------------------------------------

    def _take_snapshot(self) -> None:
        if self._snapshot is None:
            return
        self._window = []
        staging = self._async.staging if self._async is not None else None
        if staging is not None and staging.step == self.step and self._async.busy:
            # This step's state is already staged for the checkpoint in flight: the staged copy becomes the
            # replay base, and the old base's buffer is the next staging buffer. One copy, not two.
            self._snapshot, self._async.staging = staging, self._snapshot
            return
        if self._async is not None:
            self._async.release(self._snapshot)
        self._snapshot.take(self.step, table.capture(self.components))

    def _record_step(self) -> dict:
        assert self._snapshot is not None
        first_after_base = self.step == (self._snapshot.step or 0) + 1
        grads = replay.fingerprint(p.grad for p in _unwrap(self.model).parameters()) if first_after_base else None
        record = replay.step_record(self.step, self._loss, self._batch_fingerprint, grads)
        self._held.step_ended(self.step)
        self._window.append(record)
        return record

    def _replay_share(self) -> dict | None:
        """This rank's replay base for a checkpoint at the current step: digests at B and the records of B+1..N."""
        snap = self._snapshot
        if snap is None or snap.step is None or snap.step >= self.step:
            return None
        return replay.base_share(self.rank, snap, self._window)

    def _start_replay(self, path: Path, manifest: dict) -> None:
        """Restore the replay base B of checkpoint N; the loop then runs steps B+1..N again and `_finish_replay` judges them."""
        base = manifest["replay"]
        self._load(path, REPLAY_PREFIX)
        unrestored, _ = self._check_restore(base["ranks"])
        self._consume_rng()
        mine = base["ranks"][self.rank]
        self._replay = replay.ReplayCheck(self.rank, base["from_step"], manifest["step"], mine["steps"], unrestored.get(self.rank, []))
        self._resuming = (path, manifest)
        log.info("rank %d: replaying steps %d..%d from the replay base in %s", self.rank, self.step + 1, manifest["step"], path)

    def _replay_step(self, record: dict | None) -> None:
        assert self._replay is not None and record is not None
        self._replay.check(record)
        if self.step == self._replay.to_step:
            self._finish_replay()
            return
        decision = self._agreement.boundary(self.step, self._flag.raised, False)
        if decision.stop:
            self.stopped = True
            self.on_event({"event": "stop_agreed", "rank": self.rank, "step": self.step, "signal_received_at": self._flag.received_at})
            self.on_event({"event": "replay_stopped", "rank": self.rank, "step": self.step, "checkpoint_step": self._replay.to_step})
            log.info(
                "rank %d: ranks agreed to stop during the replay, after step %d; the checkpoint at step %d still stands",
                self.rank, self.step, self._replay.to_step,
            )

    def _finish_replay(self) -> None:
        assert self._replay is not None and self._resuming is not None
        check, (path, manifest) = self._replay, self._resuming
        self._replay, self._resuming = None, None
        components, own_hash = self.state_hash()
        saved = manifest["ranks"][self.rank]["components"]
        check.report.differing = sorted(n for n in set(saved) | set(components) if saved.get(n) != components.get(n))
        check.report.held_at = self._held.held_at
        reports = self._gather((own_hash, check.report))
        verdict = replay.judge(check.from_step, check.to_step, [r for _, r in reports])
        recomputed = global_hash([h for h, _ in reports])
        unrestored = {r.rank: r.unrestored for _, r in reports if r.unrestored}
        if verdict.identical or self.policy.verify != "warn":
            self._conclude(path, manifest, recomputed, unrestored, verdict)
            return
        log.warning("rank %d: %s. Loading checkpoint %s instead, because checkpoint.verify is 'warn'.", self.rank, replay.describe(verdict), path)
        self._load(path)
        mismatches, recomputed = self._check_restore(manifest["ranks"])
        for r, names in unrestored.items():
            mismatches[r] = sorted(set(mismatches.get(r, [])) | set(names))
        self._conclude(path, manifest, recomputed, mismatches, verdict)
        self._consume_rng()
        self._take_snapshot()

    def _consume_rng(self) -> None:
        """Fault injection: the classic bug of drawing random numbers between the restore and the first step."""
        for c in self.components:
            if self.chaos.consumes(c.name):
                c.obj.draw()

    def _gather(self, item: Any) -> list[Any]:
        if self.group is None:
            return [item]
        items: list[Any] = [None] * self.world_size
        dist.all_gather_object(items, item, group=self.group)
        return items

    def _check_restore(self, saved_ranks: list[dict]) -> tuple[dict[int, list[str]], str]:
        """Every rank's components whose live digests differ from `saved_ranks`, and the recomputed global hash."""
        components, own_hash = self.state_hash()
        saved = saved_ranks[self.rank]["components"]
        differing = sorted(name for name in set(saved) | set(components) if saved.get(name) != components.get(name))
        reports = self._gather((own_hash, differing))
        return {r: names for r, (_, names) in enumerate(reports) if names}, global_hash([h for h, _ in reports])

    def _conclude(self, path: Path, manifest: dict, recomputed: str, mismatches: dict[int, list[str]], verdict: replay.Verdict | None = None) -> None:
        """Report the resume; raise (or warn, under checkpoint.verify: warn) when it did not verify."""
        self.resumed = Resumed(self.step, path, manifest["global_hash"], recomputed, mismatches, verdict)
        self.on_event(
            {
                "event": "resumed",
                "rank": self.rank,
                "step": self.step,
                "path": str(path),
                "expected_hash": manifest["global_hash"],
                "recomputed_hash": recomputed,
                "match": self.resumed.match,
                "mismatches": {str(r): n for r, n in mismatches.items()},
                "replay": None if verdict is None else verdict.to_event(),
            }
        )
        if self.resumed.match:
            how = "" if verdict is None else f" by a replay of {verdict.steps} steps from step {verdict.from_step}"
            say(log, self.rank, "rank %d: resumed at step %d from %s, global hash %s verified%s", self.rank, self.step, path, recomputed, how)
            return
        problems = []
        if mismatches:
            detail = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in mismatches.items())
            where = "" if verdict is None else f" (its replay base, step {verdict.from_step})"
            problems.append(
                f"Resume verification failed at step {self.step} ({path}){where}: the restored state does not hash to what the "
                f"checkpoint recorded. Differing components: {detail}. Something was not restored, or was changed after "
                "restore (an RNG drawn between restore and the first step is the usual cause)."
            )
        if verdict is not None and not verdict.identical:
            problems.append(f"Resume verification failed at step {manifest['step']} ({path}): the {replay.describe(verdict)}.")
        message = " ".join(problems)
        if self.policy.verify == "warn":
            log.warning("%s Continuing because checkpoint.verify is 'warn'.", message)
            return
        raise ResumeMismatchError(message)

    def _close(self) -> None:
        if self._async is not None:
            self._async.close()
        self._agreement.drain()
        self._flag.uninstall()
        self._batches = None
        if self._trajectory is not None:
            self._trajectory.close()
            self._trajectory = None


REPLAY_PREFIX = "replay_"
_EPOCH_OVER = object()
CARRIED = "carried"


def _pick(root: Path, world_size: int, training: dict | None) -> tuple[str, dict] | str | None:
    """(path, manifest) of the checkpoint to resume, None to start fresh, or the error message to raise on every rank."""
    run = RunShape(world_size, training, torch.__version__, torch.get_num_threads(), _strict(training))
    try:
        found = newest_usable(root, run, strict=True)
    except UsageError as exc:
        return str(exc)
    return None if found is None else (str(found.path), found.manifest)


def _total_steps(total_steps: int | None, total_epochs: int | None, steps_per_epoch: int | None) -> int:
    if (total_steps is None) == (total_epochs is None):
        raise UsageError("The Session needs exactly one of total_steps= and total_epochs=, to know when the run is done. Pass one of them.")
    if total_steps is not None:
        return total_steps
    if steps_per_epoch is None:
        raise UsageError("total_epochs= needs a loader whose length is known (len(loader)); with this loader pass total_steps= instead.")
    return total_epochs * steps_per_epoch


def _strict(training: dict | None) -> bool:
    """determinism.mode from the run's settings; for a Session used without a config, whether torch runs deterministic."""
    mode = (training or {}).get("determinism", {}).get("mode")
    return mode == "strict" if mode is not None else torch.are_deterministic_algorithms_enabled()


class _Counters:
    """The step counter as a Stateful; epoch and step-within-epoch belong to the data position."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def state_dict(self) -> dict[str, int]:
        s = self.session
        return {"step": s.step, "epoch": s.epoch, "step_in_epoch": s.step_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        self.session.step = state["step"]


class _Metrics:
    """The running loss accumulators (a float sum is state too)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def state_dict(self) -> dict:
        return dict(self.session.metrics)

    def load_state_dict(self, state: dict) -> None:
        self.session.metrics = dict(state)


class _DataPosition:
    """Where the next batch comes from: the sampler's state as of the steps consumed, not prefetched.

    Left unrestored, the run starts over at epoch 0, position 0: a fresh process's position.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    def state_dict(self) -> dict:
        s = self.session
        if s.source is None:
            return {"epoch": s.epoch, "step_in_epoch": s.step_in_epoch}
        return s.source.state_dict(s.epoch, s.step_in_epoch)

    def load_state_dict(self, state: dict) -> None:
        s = self.session
        if s.source is None:
            s.epoch, s.step_in_epoch = state["epoch"], state["step_in_epoch"]
            return
        s.epoch, s.step_in_epoch = s.source.load_state_dict(state)


def _async_wanted(policy: CheckpointPolicy, model: torch.nn.Module) -> bool:
    if policy.async_ is not None:
        return policy.async_
    return any(p.is_cuda for p in model.parameters())


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model

