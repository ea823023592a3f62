"""The exact-resume session: the public API around a user's own DDP loop.

    session = Session(run_dir, model=ddp, optimizer=opt, loader=loader, total_steps=1000, scheduler=sched)
    for batch in session:
        loss = step(batch)
        session.report(loss)
    sys.exit(session.exit_code)

or, keeping the loop's epochs: `for epoch in session.epochs(): for batch in
session.batches(): ...`. The loader is the user's own (legato.state.adoption adopts
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
The Session only runs the loop; it delegates its claim on the run directory
(legato.session.attempt_lock), its table of state (legato.session.table), the
attempt's opening (legato.session.opening), resume (legato.session.resume),
saving (legato.session.saving), replay (legato.session.replayer), telemetry
(legato.session.telemetry) and fault injection (legato.session.chaos), and
the position (legato.session.position) is written in one place. It must never
reach into the orchestrator; it reports what happens through plain-dict events.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from legato.dist.peers import Peers
from legato.dist.reduction import restoring
from legato.dist.stop import NOTHING_AGREED, Decision, StopAgreement, StopFlag, agree_at_start, parse_signal
from legato.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, ResumeMismatchError, UsageError
from legato.events import Kind
from legato.ledger_file import read_records
from legato.paths import RunPaths
from legato.recorder import LedgerRecorder
from legato.repro.attempt import end_for_script, start_for_script
from legato.session import spacing
from legato.session.arguments import check_arguments, check_batches, checked_loss, refuse_late_carry, refuse_second_loop, total_steps_of
from legato.session.attempt_lock import AttemptLock
from legato.session.chaos import CHAOS_AT_ENV, CHAOS_RANK_ENV, Chaos
from legato.session.feed import EPOCH_OVER, Feed
from legato.session.identity import Identity
from legato.session.losses import Loss, LossBook, Rate
from legato.session.opening import open_attempt
from legato.session.pace import Pace
from legato.session.policy import CheckpointPolicy, HangPolicy, StopPolicy
from legato.session.position import Metrics, Position
from legato.session.replay_base import ReplayBase
from legato.session.replayer import Outcome, Replayer
from legato.session.resume import GO_ON_UNVERIFIED, REQUIRED, Resumed, Resumer, nothing_to_resume, resume_choice
from legato.session.saving import Saver
from legato.session.table import session_table
from legato.session.telemetry import Telemetry
from legato.session.trackers import Tracker, sinks_for
from legato.session.unsaved import Census
from legato.session.watchdog import CHECKPOINT, EPOCH_END, REPLAY, RESTORE, STEP, Watchdog
from legato.session.wrappers import ddp_of, runs_compiled, unwrap
from legato.state import adoption
from legato.state import components as table
from legato.state.components import Component
from legato.state.device_kind import gpu_kind
from legato.state.owned import Carried, as_stateful
from legato.state.sampler import resumable_loader
from legato.state.sharded import is_dtensor
from legato.store.commit import Committed
from legato.store.manifest import list_checkpoints
from legato.store.manifest_schema import COMPILED_KEY, GPUS_KEY
from legato.system import io_threads
from legato.system.lifeline import die_with_launcher
from legato.voice import refusing

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful

__all__ = [
    "CHAOS_AT_ENV",
    "CHAOS_RANK_ENV",
    "Chaos",
    "CheckpointPolicy",
    "HangPolicy",
    "Resumed",
    "Session",
    "StopPolicy",
    "resumable_loader",
]

log = logging.getLogger(__name__)
CARRIED = "carried"


class Session:
    """The user's loop made resumable: iterate it (or its epochs), report each loss, exit with its exit code.

    `stopped` turns True once the ranks agreed to stop (the stop checkpoint is then committed and the loop ends):
    the code after `for batch in session.batches():` (validation, a per-epoch scheduler step) checks
    `if session.stopped: break` and leaves the rest of the epoch to the resumed run, which runs it after the
    epoch's last batch.
    """

    @refusing
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
        hang: HangPolicy = HangPolicy(),
        chaos: Chaos | None = None,
        training: dict | None = None,
        on_event: Callable[[dict], None] | None = None,
        worker_rng: bool = True,
        ignore: Iterable[Any] = (),
        census: str = "warn",
    ) -> None:
        check_arguments(run_dir, model, optimizer, scheduler, scaler)
        # Refused before anything is recorded, as a bad argument is: a bad LEGATO_RESUME, or nothing to resume where required.
        resume = resume_choice(os.environ)
        hang, checkpoint = hang.from_env(os.environ), checkpoint.from_env(os.environ)
        if resume == REQUIRED and not list_checkpoints(RunPaths(run_dir).checkpoints):
            raise UsageError(nothing_to_resume(RunPaths(run_dir).checkpoints))
        self.source = adoption.adopt(loader, worker_rng)
        self.run_dir = Path(run_dir)
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.steps_per_epoch = None if self.source is None else self.source.steps_per_epoch
        per_epoch = None if self.source is None else self.source.batches_per_epoch
        self.total_steps = total_steps_of(total_steps, total_epochs, per_epoch)
        self.scheduler, self.scaler = scheduler, scaler
        self.extras = {name: as_stateful(f"extra.{name}", obj) for name, obj in (extras or {}).items()}
        self.policy = checkpoint
        # Without chaos from the caller, stops may be planted through the environment (tests, `legato verify --command`).
        self.chaos = chaos if chaos is not None else Chaos.from_env()
        agree_every = self.chaos.agree_every(checkpoint.agree_every_steps, from_env=chaos is None)
        self.training = training
        self.carried = Carried()
        self._peers = Peers.join()
        self.rank, self.world_size = self._peers.rank, self._peers.world_size
        # Before anything is recorded: a second launch into this run directory is refused here, having written nothing.
        self._attempt_lock = AttemptLock.claim(self.run_dir, self._peers)
        self.identity = Identity.establish(self.run_dir, self._peers, scripted=on_event is None)
        # A script's own Session writes its run into the run directory, and captures each attempt's environment per
        # node in a process of its own; under `legato run` the job side does both.
        self.on_event = on_event or LedgerRecorder(self.run_dir, self.identity.tag)
        self._capture = None if on_event else start_for_script(self.run_dir, self.identity.job_id, self.identity.attempt - 1, os.environ)
        # Started now, before any loader forks its workers, and kept until the loop ends (never a thread per step);
        # the checkpoint files' threads likewise, for the process's life (a thread ending beside a fork can hang the child).
        io_threads.start()
        self._watchdog = Watchdog.start(
            hang, self._peers.gather, self.rank, self.run_dir, self.identity.job_id, self.identity.attempt, self.on_event
        )
        timed = None if runs_compiled(model) or any(is_dtensor(p) for p in model.parameters()) else unwrap(model)
        self._pace = Pace(RunPaths(self.run_dir).pace(self.identity.job_id, self.identity.attempt, self.rank), timed, self.rank)
        self.generators = {} if self.source is None else dict(self.source.generators)
        self._position = Position(self.steps_per_epoch)
        self._metrics = Metrics()
        self.components = session_table(
            model, optimizer, scheduler, scaler, self._position, self._metrics, self.extras, self.source, self.generators
        )
        self.stopped = False
        self._loud_at = 0  # boundaries before this step are quiet (`_next_loud`): the first one is not

        self._feed = Feed(self.source, self._position, per_epoch if total_epochs is not None else None)
        self._telemetry = Telemetry(self.rank, self.total_steps, self.on_event)
        self._ignored = list(ignore)
        self._agreement = StopAgreement(self._peers.group, agree_every)
        self._flag = StopFlag(tuple(parse_signal(s) for s in stop.signals))
        # What decides the kernels, besides threads and the CPU's instruction set: recorded, and compared on resume.
        compiled, gpus = runs_compiled(model), tuple(self._peers.gather(gpu_kind(model)))
        # The manifest fields every checkpoint of this attempt carries; the census adds what it found unsaved, a resume
        # its continuation mark, if any.
        carried = {"training": training, COMPILED_KEY: compiled, GPUS_KEY: list(gpus)}
        self._census = Census(self._peers, self._telemetry, census, self._registered, carried)
        self._resumer = Resumer(
            self.checkpoint_root,
            self._peers,
            self.components,
            self._feed,
            self.chaos,
            self._telemetry,
            checkpoint.verify,
            checkpoint.reshard,
            compiled,
            gpus,
            carried,
            go_on_unverified=resume == GO_ON_UNVERIFIED,
        )
        self._replayer = Replayer(self._resumer, self._flag)
        background = checkpoint.async_ if checkpoint.async_ is not None else any(p.is_cuda for p in model.parameters())
        self._saving = Saver(
            self.checkpoint_root,
            self._peers,
            self.components,
            self._position,
            checkpoint,
            self._telemetry,
            carried,
            self.chaos.kill,
            background,
            failures=lambda: spacing.failures_since_start(read_records(self.run_dir), time.time()),
        )
        self._losses = LossBook()
        self._loss: Loss | None = None  # this step's, once reported
        self._lr: Rate | None = None
        self._begun = False
        self._resumed_step = 0
        self._trackers: list[Tracker] = []
        # Installed now, not when the loop starts: a stop signal before the loop is kept, and honoured before the first step.
        self._flag.install()
        # Under a legato launcher (python -m legato.torchrun, python -m legato) a rank dies with it, never an orphan.
        die_with_launcher()

    # -- what the caller reads ---------------------------------------------

    @property
    def exit_code(self) -> int:
        """EXIT_STOPPED after an agreed stop (the job requeues), EXIT_FAILED when the final checkpoint could not be written
        (the run is not done: running the command again resumes the checkpoint that stands), else EXIT_OK."""
        if self._saving.unsaved_end:
            return EXIT_FAILED
        return EXIT_STOPPED if self.stopped else EXIT_OK

    @property
    def checkpoint_root(self) -> Path:
        """Where this run's checkpoints live."""
        return RunPaths(self.run_dir).checkpoints

    @property
    def replaying(self) -> bool:
        """True while the steps of a resume's replay run (they write no trajectory and no checkpoint).

        A replay runs the user's loop again over steps that were already logged: log nothing while it is True
        (`if not session.replaying: writer.add_scalar(...)`), but run everything else, validation included.
        """
        return self._replayer.active

    @property
    def run_id(self) -> str:
        """The run's id, the same on every rank and every attempt (kept in the run directory): continue a tracker's run under it."""
        return self.identity.run_id

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first launch, one more for each relaunch or requeue."""
        return self.identity.attempt

    @property
    def resumed_step(self) -> int:
        """The step this attempt's own training starts at: the checkpoint it resumed (a replay re-runs the steps
        before it), 0 on a fresh start. Known once the loop began; steps from here on are logged for the first time
        (a tracker purges what a killed attempt logged past it: `SummaryWriter(purge_step=session.resumed_step)`)."""
        return self._resumed_step

    @property
    def begun(self) -> bool:
        """True once the loop began (the resume, if any, is done and `resumed_step` is known)."""
        return self._begun

    @property
    def step(self) -> int:
        """Steps done so far (the index of the step about to run)."""
        return self._position.step

    @property
    def epoch(self) -> int:
        """The epoch the run is in."""
        return self._position.epoch

    @property
    def step_in_epoch(self) -> int:
        """Steps done in this epoch."""
        return self._position.step_in_epoch

    @property
    def metrics(self) -> dict:
        """The running loss accumulators: loss_sum and loss_count."""
        return self._metrics.values

    @property
    def resumed(self) -> Resumed | None:
        """How this process resumed, once it did; None for a fresh start."""
        return self._resumer.resumed

    @property
    def last_checkpoint(self) -> Committed | None:
        """The newest checkpoint this process published (rank 0 knows the asynchronous ones)."""
        return self._saving.last_checkpoint

    # -- the loop -------------------------------------------------------

    @refusing
    def __iter__(self) -> Iterator[Any]:
        """Yields each step's batch (with no loader: the index of the step about to run), across epochs."""
        with self._lifetime():
            self._begin()
            yield from self._steps()

    @refusing
    def epochs(self) -> Iterator[int]:
        """Yields each epoch number, resumed ones included; the body iterates `batches()` and may validate after it.

        A resume lands where the run stopped: in the middle of an epoch's batches, or after its last batch and
        before what the body does after it (validation, a per-epoch scheduler step), which then runs again.
        """
        self._feed.epoch_mode = True
        with self._lifetime():
            self._begin()
            while self.step < self.total_steps and not self.stopped:
                yield self.epoch
                if self.stopped:
                    break
                self._position.next_epoch()
                self._feed.drop()

    @refusing
    def batches(self, loader: Any = None) -> Iterator[Any]:
        """This epoch's batches from the session's loader, from where the run stands (inside `epochs()`)."""
        check_batches(self._feed.epoch_mode, loader, self.loader)
        yield from self._steps()

    @refusing
    def report(self, loss: torch.Tensor | float) -> None:
        """Record this step's loss (exactly, as float.hex) and add it to the running accumulators."""
        self._loss = self._losses.take(checked_loss(loss))
        self._metrics.add(self._loss)

    def state_hash(self) -> tuple[dict[str, str], str]:
        """This rank's component digests and rank hash, from the live objects (draws no RNG)."""
        return table.state_hash(self.components)

    @refusing
    def carry(self, batch: Any) -> Any:
        """Register the batch the loop holds into the next step (a prefetched batch) and return it unchanged.

        It is saved with every checkpoint; on a resume its tensors are overwritten in place with the saved ones.
        """
        refuse_late_carry(self._begun, any(c.name == CARRIED for c in self.components))
        self.carried.hold(batch)
        return batch

    @refusing
    def tracker(
        self,
        *,
        tensorboard: str | Path | None = None,
        tensorboard_options: Mapping[str, Any] | None = None,
        wandb: Mapping[str, Any] | None = None,
    ) -> Tracker:
        """Rank 0's dashboards, each step's points written once whatever stops, kills and replays the run goes through
        (legato.session.trackers): `tensorboard` is a SummaryWriter's folder (`tensorboard_options` its other arguments),
        `wandb` wandb.init's options (the run's id and resumption are the tracker's). Log with `tracker.log({...})`."""
        tracker = Tracker(self, sinks_for(tensorboard, tensorboard_options or {}, wandb))
        self._trackers.append(tracker)
        return tracker

    def ignore(self, *objects: Any) -> None:
        """Mark objects as needing no saving (a frozen teacher, a validation StatefulDataLoader): the census of unsaved state skips them."""
        self._ignored.extend(objects)

    # -- internals -------------------------------------------------------

    def _registered(self) -> list[Any]:
        """What the Session saves or was told to ignore: the census of unsaved state counts everything else."""
        return [
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            self.loader,
            self.source,
            self.carried,
            *self.extras.values(),
            *self.generators.values(),
            *self._ignored,
        ]

    def _steps(self) -> Iterator[Any]:
        while self._position.step < self.total_steps and not self.stopped and not (self._feed.epoch_mode and self._position.epoch_complete):
            batch = self._feed.next()
            if batch is EPOCH_OVER:
                return
            self._loss = None
            lr = self.optimizer.param_groups[0]["lr"]
            self._lr = lr if type(lr) is float else self._losses.rate(lr)  # a CUDA tensor's float would wait for the GPU
            self._saving.base.yielded(batch)
            self._pace.yielded()
            yield batch
            self._end_step()
        if self._feed.epoch_mode:
            self._watchdog.beat(EPOCH_END)  # the body's own epoch end (a validation) runs now

    def _begin(self) -> None:
        self._begun = True
        self._watchdog.beat(RESTORE)
        # Before the resume, so what legato does not save is named before a resume says it verified.
        self._census.check(self.step, "start")
        if self.carried.used:
            # A batch carried before the loop: saved from now on, and restored into its tensors below.
            self.components.insert(next(i for i, c in enumerate(self.components) if c.name == "data"), Component(CARRIED, self.carried))
        found, resume_step = open_attempt(
            self._resumer, self._saving, self._replayer, self._position, self.training, self.total_steps, self.world_size
        )
        self._resumed_step = resume_step
        # The resume restored the bucket layout with the other components; chaos "buckets" leaves DDP's own (fault injection).
        layout = restoring(ddp_of(self.model), found is not None, self.chaos.skips("buckets"))
        self._telemetry.emit(Kind.BUCKET_LAYOUT, step=self.step, pinned=layout.restored, reason=layout.reason)
        self._telemetry.open_trajectory(RunPaths(self.run_dir).trajectory(self.rank), resume_step)
        self._saving.take_snapshot()
        self._watchdog.beat(REPLAY if self._replayer.active else STEP)
        if agree_at_start(self._flag, self._peers.group):
            # A stop signal during start-up: stop before the first step; the newest checkpoint already holds this state.
            # Name the checkpoint's step, not a replay base's: it is where the next attempt starts.
            self._telemetry.say(
                "rank %d: stop signal during start-up; stopping at step %d without a new checkpoint", self.rank, resume_step
            )
            self._telemetry.stop_agreed(resume_step, self._flag.received_at, at_start=True)
            self.stopped = True
        elif found is not None and self.step >= self.total_steps:
            self._telemetry.already_complete(self.step, found["global_hash"])

    def _end_step(self) -> None:
        if self._position.advance(self._feed.epoch_mode):
            # The finished iterator goes now either way, as the plain loop's does, with its workers.
            self._feed.drop()
        step, base = self._position.step, self._saving.base  # every step runs this: each lookup made once
        record = base.record_step(step, self._loss, self.model)
        if step < self._loud_at and not self._flag.raised:
            # Most steps: what the general path below comes to when no vote is read and nothing is due, in fewer calls
            # (each function a boundary touches costs about a microsecond of CPU, cold between the body's torch calls).
            self._saving.quiet_end(self._loss, self._lr)
            self._marks(step)  # no base is due before `_loud_at` either
            return
        replaying = self._replayer.active
        self.chaos.slow_step()
        if not replaying:
            self.chaos.after_step(self.rank, step, self._flag.signals[0])
        decision = self._agree(step, replaying)
        if replaying:
            self._losses.settle()  # the replay compares this step's loss bits now
            outcome = self._replayer.step(step, record, base.held.held_at, decision)
            self.stopped = outcome is Outcome.STOPPED
            if outcome is Outcome.FELL_BACK:
                self._saving.take_snapshot()
        else:
            reason = self._saving.reason(decision, self.total_steps)
            census = self._census.alongside(reason, step, sys._getframe()) if reason else contextlib.nullcontext()
            if reason:
                self._watchdog.beat(CHECKPOINT)
                for tracker in self._trackers:  # the points of the steps this checkpoint covers are on disk before it
                    tracker.flush()
            self._saving.step_end(reason, self._loss, self._lr, self._flag.received_at, census)
            self.stopped = reason == "signal"
            if not self.stopped:
                self._census.early_look(step, sys._getframe())
        self._loud_at = self._next_loud(step)
        self._tail(step, base)

    def _tail(self, step: int, base: ReplayBase) -> None:
        """A loud boundary's end: a new replay base when one is due, then the marks."""
        if base.due(step, self.total_steps) and not self.stopped:
            self._saving.take_snapshot()
        self._marks(step)

    def _marks(self, step: int) -> None:
        """Every boundary's last act: the watchdog's and the pace's marks."""
        self._watchdog.stepped(step, REPLAY if self._replayer.active else STEP)
        self._pace.stepped(step)

    def _next_loud(self, step: int) -> int:
        """After the boundary of `step`: the first step whose boundary may do more than write its trajectory line (a
        stop signal makes any boundary loud). Until it: no agreement check, nothing due by steps, no replay, no early
        look of the census, no planted fault."""
        if self._replayer.active or self.chaos.per_step or self._census.looking:
            return step + 1
        return min(self._agreement.next_check(step), self._saving.next_due(step, self.total_steps))

    def _agree(self, step: int, replaying: bool) -> Decision:
        """The one place the ranks vote at a step boundary: this rank's stop flag, and while training the Saver's votes (a
        replay writes nothing, so it votes on the stop alone; its last step is judged, not voted on). The votes are
        gathered only where the agreement reads them."""
        if replaying and self._replayer.at_end(step):
            return NOTHING_AGREED
        raised = self._flag.raised
        if not self._agreement.checks_at(step, raised):
            return NOTHING_AGREED
        votes = {} if replaying else self._saving.votes()
        return self._agreement.boundary(step, raised, **votes)

    @contextlib.contextmanager
    def _lifetime(self) -> Iterator[None]:
        """The loop's span, one per Session; on its way out the Session records an early exit and closes what it opened.
        Only an orderly end (done, stopped, left with `break`, or refused on every rank) also ends the control group:
        ending it joins its threads, which after a lost peer may wait in a collective that never completes."""
        refuse_second_loop(self._begun, self.step)
        orderly = True
        try:
            yield
        except BaseException as exc:
            orderly = isinstance(exc, (GeneratorExit, UsageError, ResumeMismatchError))
            # After an agreed stop, or the end, a `break` is the plan; after a refused resume its verdict is the record.
            if not self.stopped and self.step < self.total_steps and not self._resumer.refused:
                self._telemetry.loop_left(self.step, self._saving.newest_published(), exc)
            raise
        finally:
            self._close(orderly)

    def _close(self, orderly: bool) -> None:
        self._watchdog.stop()
        self._pace.close(self.step)
        end_for_script(self._capture)
        self._saving.close()
        self._agreement.close()
        self._flag.uninstall()
        self._feed.close()
        self._telemetry.close()
        self._attempt_lock.release()
        if orderly:
            self._peers.close()
