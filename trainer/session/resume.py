"""Resuming a run: select the checkpoint, restore it, check the restore, conclude (report or refuse).

Rank 0 picks the newest usable checkpoint (legato.store.resumable.newest_usable)
and hands it to the others; every rank loads it, then the ranks verify its
files together (legato.session.file_checks) from the page cache the load
filled, so a resume reads them from disk once; where they do not verify, rank 0
picks again, verifying each candidate's files before loading. Only then is the
state restored (RNG last, right before the first resumed step); every rank
recomputes its digests, and the ranks compare them with the manifest. A resume
that does not verify says one paragraph and raises ResumeMismatchError on every
rank (exit 3 where nothing catches it), naming LEGATO_RESUME=unverified, the
deliberate way on: with it (or under checkpoint.verify: warn, where the
checkpoint holds its own state) the run continues from the restored state,
the `continued_unverified` record names the step and the components, and
every later checkpoint carries that mark (`unverified` in its manifest), so no
later resume claims bitwise continuity with the run's start. This module must
never call back into the Session (it works on the component table, the
position's feed and plain data), and never restore into the live objects state
whose files have not verified.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from legato.dist.peers import Peers
from legato.errors import ResumeMismatchError, UsageError
from legato.events import Kind, except_label, resharded_label, unverified_label
from legato.session import replay
from legato.session.chaos import Chaos
from legato.session.feed import Feed
from legato.session.file_checks import VerifiedTogether
from legato.session.position import Position
from legato.session.telemetry import Telemetry
from legato.state import components as table
from legato.state.components import Component
from legato.state.hashing import HOST_RULE, global_hash, tensor_rules
from legato.store import bases, layout, reshard
from legato.store.manifest import Verifier, check_listed
from legato.store.manifest_schema import DIVERGED, GPUS_KEY, TENSOR_DIGESTS_KEY, UNREGISTERED_KEY, UNVERIFIED_KEY
from legato.store.resumable import RunShape, newest_usable
from legato.store.trajectory_changes import trajectory_changes
from legato.voice import counted, refuse

log = logging.getLogger(__name__)

RESUME_ENV = "LEGATO_RESUME"
GO_ON_UNVERIFIED = "unverified"  # LEGATO_RESUME=unverified: continue from a checkpoint whose resume does not verify
REQUIRED = "required"  # LEGATO_RESUME=required: this launch must resume (a job script's relaunch), never start fresh

# What a resume of a checkpoint (path, manifest) loads first: (directory, file prefix), or None when it loads nothing
# with `Resumer.load` (a resharded restore, a checkpoint this run cannot resume).
Target = Callable[[Path, dict], tuple[Path, str] | None]


@dataclass
class Resumed:
    """How a resume went: where from, the hashes compared, what differed, and the replay's verdict."""

    step: int
    path: Path
    expected_hash: str
    recomputed_hash: str
    mismatches: dict[int, list[str]] = field(default_factory=dict)
    replay: replay.Verdict | None = None
    resharded: dict[str, int] | None = None  # {"from": N, "to": M}: restored from another world size, not bitwise
    seconds: float = 0.0  # from selecting the checkpoint to the verdict (the replay included)

    @property
    def match(self) -> bool:
        return not self.mismatches and (self.replay is None or self.replay.identical)


class Resumer:
    """One rank's side of selecting, restoring and verifying a checkpoint."""

    def __init__(
        self,
        root: Path,
        peers: Peers,
        components: list[Component],
        feed: Feed,
        chaos: Chaos,
        telemetry: Telemetry,
        verify: str,
        reshard: bool = False,
        compiled: bool = False,
        gpus: tuple[str | None, ...] | None = None,
        carried: dict | None = None,
        go_on_unverified: bool = False,
    ) -> None:
        self.root, self.peers, self.components, self.feed = root, peers, components, feed
        self.chaos, self.telemetry, self.verify, self.reshard = chaos, telemetry, verify, reshard
        # The manifest fields this run's next checkpoints carry: a continuation past a failed verification goes in there.
        self.carried = carried if carried is not None else {}
        self.go_on_unverified = go_on_unverified  # LEGATO_RESUME=unverified
        self.refused = False  # the resume did not verify and the attempt ends: its verdict is the record, not how the loop was left
        self.compiled = compiled  # whether this attempt's model runs under torch.compile
        self.gpus = gpus  # every rank's GPU (legato.state.device_kind), in rank order
        self._capabilities: tuple[str, ...] | None = None  # every rank's torch CPU capability, gathered at the pick
        self._by_config = False  # whether the run has a config (the bundled trainer), for the wording of a fix
        self.resumed: Resumed | None = None
        self._started = time.perf_counter()
        self._preloaded: tuple[tuple[Path, str], dict] | None = None  # (where, states) loaded by `select`, verified since
        self.skipped: list[str] = []  # the newer checkpoints the pick passed over, as "step_N: why" (a corrupt file)

    def select(self, training: dict | None, loads: Target) -> tuple[Path, dict] | None:
        """Collective: the checkpoint to resume (path and manifest, the same on every rank), its files verified; None to start fresh.

        Rank 0 picks the newest checkpoint whose files are all there at their sizes, reading none of their bytes. Every rank
        loads what the resume will restore first (`loads`: the checkpoint itself or its replay base), and only then are the
        files verified, every rank hashing its share of them from the page cache the load filled: a resume reads its files
        from disk once. Nothing is restored into the live objects before they verify. Where they do not, or the load
        failed, rank 0 picks again verifying each candidate's files first, which skips and names a bad checkpoint."""
        self._started = time.perf_counter()
        self._preloaded = None
        picked = self._pick(training, check_listed)
        if picked is None:
            return None
        where = loads(*picked)
        if where is not None and self._preload(*picked, where):
            return picked
        self._preloaded = None
        return self._pick(training, None)

    def _pick(self, training: dict | None, check: Verifier | None) -> tuple[Path, dict] | None:
        """Rank 0 picks with `check` (None: every rank hashing its share of each candidate's files) and hands the pick to the others."""
        run = self.root, self.peers.world_size, training, self.reshard
        capabilities = self._capabilities = tuple(self.peers.gather(torch.backends.cpu.get_cpu_capability()))
        self._by_config = training is not None
        try:
            if check is None:  # the other ranks hash their shares of each candidate's files while rank 0 picks
                led = VerifiedTogether(self.peers).led(lambda verify: pick(*run, verify, capabilities, self.compiled, self.gpus))
            else:  # rank 0 picks alone: the others have nothing to verify, so they do not serve
                led = pick(*run, check, capabilities, self.compiled, self.gpus) if self.peers.rank == 0 else None
        except Exception as exc:
            if self.peers.rank == 0:  # the others wait for the pick: they hear why none comes, then rank 0 raises
                self._tell_failed(exc)
            raise
        picked = self.peers.from_leader(led)
        if isinstance(picked, PickFailed):
            raise RuntimeError(
                f"rank 0 failed while picking the checkpoint to resume ({picked.error}); its log has the traceback. Nothing "
                "was restored, and the checkpoints are as they were: mend the cause and run again."
            )
        if isinstance(picked, str):
            raise UsageError(picked)
        if picked is None:
            return None
        path, manifest, self.skipped = picked
        return Path(path), manifest

    def _tell_failed(self, exc: Exception) -> None:
        """Rank 0: hand the ranks waiting for its pick the error that ended it. Where telling them fails too (the error was
        a peer's loss), rank 0 still raises its own error, not the broadcast's."""
        try:
            self.peers.from_leader(PickFailed(f"{type(exc).__name__}: {exc}"))
        except Exception as lost:
            log.debug("rank 0: could not tell the other ranks that the pick failed (%s)", lost)

    def _preload(self, path: Path, manifest: dict, where: tuple[Path, str]) -> bool:
        """Collective: load `where` (directory, prefix) of checkpoint `path`, then verify every file the checkpoint rests on;
        whether every rank loaded and every file verified. The loaded states wait for `load`."""
        try:
            self._preloaded = (where, layout.load(self.components, where[0], self.peers.rank, where[1]))
        except Exception as exc:  # bytes not yet verified may fail to load: the pick that verifies first names the cause
            log.debug("rank %d: loading %s before verifying it failed (%s); verifying first", self.peers.rank, where[0], exc)
        # One exchange carries rank 0's verdict on the files and every rank's load.
        reports = self.peers.gather((self._first_problem(resting_on(path, manifest)), self._preloaded is not None))
        problem, loaded = reports[0][0], all(ok for _, ok in reports)
        if problem is not None:
            log.debug("checkpoint %s does not verify after loading it (%s); verifying each candidate first", path, problem)
        return loaded and problem is None

    def _first_problem(self, listed: list[tuple[Path, dict]]) -> str | None:
        """Collective: every rank hashes its share of each (directory, files); the first problem on rank 0 (None there when
        every file verified; None on the other ranks)."""

        def first_problem(verify: Verifier) -> str | None:
            try:
                for directory, files in listed:
                    verify(directory, files)
            except (ValueError, KeyError, TypeError, OSError) as exc:
                return str(exc)
            return None

        return VerifiedTogether(self.peers).led(first_problem)

    def restore(self, path: Path, manifest: dict) -> None:
        """Load checkpoint `path` itself, check its digests, and report the resume."""
        if manifest["world_size"] != self.peers.world_size:
            self.restore_resharded(path, manifest)
            return
        self.load(path)
        mismatches, recomputed = self.check(manifest["ranks"])
        self.conclude(path, manifest, recomputed, mismatches)
        self.chaos.consume_rng(self.components)

    def load(self, path: Path, prefix: str = "") -> None:
        """Restore every component from `path` (RNG last; the feed reopens the epoch's iterator at the first batch)."""
        preloaded, self._preloaded = self._preloaded, None
        states = (
            preloaded[1]
            if preloaded is not None and preloaded[0] == (path, prefix)
            else layout.load(self.components, path, self.peers.rank, prefix)
        )
        table.restore(self.components, states, self.chaos.skips, last=False, source=path)
        self.feed.resumed()
        if not self.chaos.skips("data"):  # a data position left unrestored on purpose is the verification's to name
            _check_data_position(path, states, self.feed.position, "with this run's loader")
        # RNG goes last, right before the first resumed step: nothing may draw after it.
        table.restore(self.components, states, self.chaos.skips, last=True, source=path)

    def restore_resharded(self, path: Path, manifest: dict) -> None:
        """Load checkpoint `path` of another world size resharded (opted into), and report it as not bitwise.

        A checkpoint whose state is held by its replay is resharded from its base (a full state at the base's step),
        and the run continues from there."""
        old, new = manifest["world_size"], self.peers.world_size
        directory, prefix = bases.location(path, manifest) if bases.held_by_replay(manifest) else (path, "")
        states = reshard.load(self.components, directory, self.peers.rank, old, new, prefix)
        present = [c for c in self.components if c.name in states]
        table.restore(present, states, self.chaos.skips, last=False, source=path)
        self.feed.resumed()
        _check_data_position(path, states, self.feed.position, f"re-divided over {new} ranks")
        table.restore(present, states, self.chaos.skips, last=True, source=path)
        _, recomputed = self.check([{"components": {}}] * new)
        resharded = {"from": old, "to": new}
        self.carry_marks(manifest)
        seconds = time.perf_counter() - self._started
        self.resumed = Resumed(self.feed.position.step, path, manifest["global_hash"], recomputed, resharded=resharded, seconds=seconds)
        self.telemetry.emit(
            Kind.RESUMED,
            step=self.resumed.step,
            path=str(path),
            expected_hash=manifest["global_hash"],
            recomputed_hash=recomputed,
            match=True,
            mismatches={},
            replay=None,
            seconds=round(seconds, 3),
            resharded=resharded,
            unverified=self.carried.get(UNVERIFIED_KEY),
            unregistered=self.carried.get(UNREGISTERED_KEY),
            skipped=self.skipped or None,
        )
        self.telemetry.say("rank %d: resumed at step %d from %s, %s", self.peers.rank, self.resumed.step, path, resharded_label(resharded))
        self.chaos.consume_rng(self.components)

    def check(self, saved_ranks: list[dict]) -> tuple[dict[int, list[str]], str]:
        """Collective: every rank's components whose live digests differ from `saved_ranks`, and the recomputed global hash."""
        components, own_hash = table.state_hash(self.components)
        saved = saved_ranks[self.peers.rank]["components"]
        differing = sorted(name for name in set(saved) | set(components) if saved.get(name) != components.get(name))
        reports = self.peers.gather((own_hash, differing))
        return {r: names for r, (_, names) in enumerate(reports) if names}, global_hash([h for h, _ in reports])

    def conclude(
        self, path: Path, manifest: dict, recomputed: str, mismatches: dict[int, list[str]], verdict: replay.Verdict | None = None
    ) -> None:
        """Report the resume; raise (or warn, under checkpoint.verify: warn) when it did not verify.

        A checkpoint whose state is held by its replay is refused under "warn" too: nothing else proves the state."""
        step, seconds = self.feed.position.step, time.perf_counter() - self._started
        self.resumed = Resumed(step, path, manifest["global_hash"], recomputed, mismatches, verdict, seconds=seconds)
        mark = self.carry_marks(manifest)
        self.telemetry.emit(
            Kind.RESUMED,
            step=step,
            path=str(path),
            expected_hash=manifest["global_hash"],
            recomputed_hash=recomputed,
            match=self.resumed.match,
            mismatches={str(r): n for r, n in mismatches.items()},
            replay=None if verdict is None else verdict.to_event(),
            seconds=round(seconds, 3),
            resharded=None,
            unverified=mark,
            unregistered=self.carried.get(UNREGISTERED_KEY),
            skipped=self.skipped or None,
        )
        if self.resumed.match:
            how = (
                ""
                if verdict is None
                else f" by a replay of {counted(verdict.steps, 'step')} from step {verdict.from_step} in {verdict.seconds:.2f}s"
            )
            since = "" if not mark else f" (bitwise since step {mark['step']} only: {unverified_label(mark)})"
            self.telemetry.say(
                "rank %d: resumed at step %d from %s, global hash %s verified%s%s (resume %.2fs)%s",
                self.peers.rank,
                step,
                path,
                recomputed,
                how,
                except_label(self.carried.get(UNREGISTERED_KEY)),
                seconds,
                since,
            )
            return
        changes = trajectory_changes(manifest, path, torch.get_num_threads(), self._capabilities, self.compiled, self.gpus, self._by_config)
        message = _problems(step, path, manifest, mismatches, verdict, changes)
        going = self.going_on(manifest)
        if going is not None:
            self._continue_unverified(step, mismatches, verdict, message, going)
            return
        if bases.held_by_replay(manifest):
            message += (
                f" The checkpoint holds its state at step {manifest['step']} only as its replay, so there is no saved state to "
                "fall back to (checkpoint.verify: warn does not go on from it). Undo what changed "
                "since the run that wrote it (code, data, settings, libraries, the GPU model, a non-deterministic step) and run "
                "the same command again: the checkpoint is unharmed."
            )
        message = (
            f"FAILED: resume not verified. {message} To go on from this checkpoint anyway, by a deliberate choice that the run "
            f"records (it then no longer claims to be bitwise the run it started as), run the same command with "
            f"{RESUME_ENV}={GO_ON_UNVERIFIED} in its environment."
        )
        refuse(log, self.peers.rank, "%s Every rank exits %d.", message, ResumeMismatchError.exit_code)
        self.refused = True
        raise ResumeMismatchError(message)

    def going_on(self, manifest: dict) -> str | None:
        """How a resume of `manifest` that does not verify goes on anyway, or None when it is refused: LEGATO_RESUME=unverified
        always; checkpoint.verify: warn only where the checkpoint holds its own state (not only its replay)."""
        if self.go_on_unverified:
            return f"{RESUME_ENV}={GO_ON_UNVERIFIED}"
        if self.verify == "warn" and not bases.held_by_replay(manifest):
            return "checkpoint.verify: warn"
        return None

    def carry_marks(self, manifest: dict) -> dict | None:
        """Carry `manifest`'s marks into the next checkpoints: an earlier continuation past a failed verification (returned)
        and the names of the objects the census found unsaved (joined with this attempt's)."""
        mark = manifest.get(UNVERIFIED_KEY)
        if mark:
            self.carried.setdefault(UNVERIFIED_KEY, mark)
        unregistered = set(manifest.get(UNREGISTERED_KEY) or []) | set(self.carried.get(UNREGISTERED_KEY) or [])
        if unregistered:
            self.carried[UNREGISTERED_KEY] = sorted(unregistered)
        return self.carried.get(UNVERIFIED_KEY)

    def _continue_unverified(
        self, step: int, mismatches: dict[int, list[str]], verdict: replay.Verdict | None, message: str, how: str
    ) -> None:
        """Go on from the restored state by the user's choice (`how`): recorded in the ledger and in every later checkpoint."""
        differing = {name for names in mismatches.values() for name in names}
        if verdict is not None:
            differing.update(name for names in verdict.differing_at_end.values() for name in names)
        mark = {"step": step, "components": sorted(differing), "how": how}
        self.carried.setdefault(UNVERIFIED_KEY, mark)
        self.telemetry.emit(Kind.CONTINUED_UNVERIFIED, **mark)
        if self.peers.rank == 0:
            log.warning(
                "%s Continuing unverified by %s: %s. From here on the run is not proven bitwise with its start; later "
                "resumes are verified against the state from step %d.",
                message,
                how,
                unverified_label(mark),
                step,
            )


@dataclass(frozen=True)
class PickFailed:
    """What rank 0 hands the other ranks when picking the checkpoint raised (a disk's read error): the error, in words."""

    error: str


def resume_choice(environ: Mapping[str, str]) -> str:
    """This launch's LEGATO_RESUME: "" (resume when there is a checkpoint), GO_ON_UNVERIFIED or REQUIRED; a UsageError else."""
    value = environ.get(RESUME_ENV, "").strip()
    if value in ("", GO_ON_UNVERIFIED, REQUIRED):
        return value
    raise UsageError(
        f"{RESUME_ENV}={value[:40]!r} is not a choice legato knows. {RESUME_ENV}={GO_ON_UNVERIFIED} continues a run from a checkpoint "
        f"whose resume does not verify (recorded as such); {RESUME_ENV}={REQUIRED} refuses a launch that finds no checkpoint to "
        "resume (a job script's relaunch); unset it for neither."
    )


def nothing_to_resume(root: Path) -> str:
    """The refusal of a launch under LEGATO_RESUME=required that finds no checkpoint under `root`."""
    return (
        f"{RESUME_ENV}={REQUIRED}, but {root} holds no checkpoint to resume, so this launch would train from step 0. Check the "
        "run directory the command names (a relaunch into a mistyped one starts a new run), or unset "
        f"{RESUME_ENV} to start fresh."
    )


def _problems(
    step: int, path: Path, manifest: dict, mismatches: dict[int, list[str]], verdict: replay.Verdict | None, changes: list[str]
) -> str:
    """The paragraph of a failed resume: what differed, and its cause where known (recorded at the save, or a change of
    this run's that takes it off the trajectory: `changes`, legato.store.trajectory_changes) instead of a guess."""
    problems = []
    causes = [_diverged(manifest), _rules_changed(manifest, path)]
    known = " ".join([cause for cause in causes if cause] + [f"{change}." for change in changes])
    if mismatches:
        detail = "; ".join(f"rank {r}: {', '.join(names)}" for r, names in mismatches.items())
        where = "" if verdict is None else f" (its replay base, step {verdict.from_step})"
        problems.append(
            f"Resume verification failed at step {step} ({path}){where}: the restored state does not hash to what the "
            f"checkpoint recorded. Differing components: {detail}. {_likely({n for names in mismatches.values() for n in names})}"
        )
    if verdict is not None and not verdict.identical:
        # A cause recorded at the save is known, not guessed: the replay's guess would name another one first.
        problems.append(f"Resume verification failed at step {manifest['step']} ({path}): the {replay.describe(verdict, guess=not known)}.")
    if problems and known:
        problems.append(known)
    return " ".join(problems)


def _likely(names: set[str]) -> str:
    """The usual cause for these differing components: a draw after the restore for generators, otherwise an object that
    is not the one that wrote the checkpoint (an SGD where it saved an AdamW loads without an error) or was changed."""
    if names and all(name.startswith("rng.") for name in names):
        return "A generator was drawn from between the restore and the first step, or was not restored."
    return (
        f"This run's {', '.join(sorted(names))} is not what wrote the checkpoint (another class, settings or shapes in the "
        "script) or was changed after the restore, before the first step; or something was not restored."
    )


def _rules_changed(manifest: dict, path: Path) -> str:
    """The cause, where the checkpoint's GPU tensors were digested by another rule than this legato's (an older legato
    digested them with XXH3 on the host): the restored bytes may be right, and no digest here can prove them."""
    if not any(manifest.get(GPUS_KEY) or []):
        return ""
    saved = manifest.get(TENSOR_DIGESTS_KEY, {}).get("cuda", HOST_RULE)
    now = tensor_rules().get("cuda", HOST_RULE)
    if saved == now:
        return ""
    return (
        f"Checkpoint {path} digested its GPU tensors by the rule {saved!r}, and this legato digests them by {now!r}, so its "
        "digests cannot prove this resume. Finish the run with the legato that wrote the checkpoint."
    )


def _diverged(manifest: dict) -> str:
    """The cause, where the checkpoint recorded it: a rank's replicated state differed from the copy written for every rank."""
    found: dict[int, tuple[set[str], set[int]]] = {}
    for entry in [*manifest["ranks"], *manifest.get("replay", {}).get("ranks", [])]:
        if DIVERGED in entry:
            tensors, writers = found.setdefault(entry["rank"], (set(), set()))
            tensors.update(entry[DIVERGED]["tensors"])
            writers.update(entry[DIVERGED]["writers"])
    if not found:
        return ""
    detail = "; ".join(
        f"rank {rank}: {', '.join(sorted(t)[:6])}{', ...' if len(t) > 6 else ''}, written by rank {', '.join(map(str, sorted(w)))}"
        for rank, (t, w) in sorted(found.items())
    )
    return (
        f"The cause was recorded when this state was saved: these ranks' copies of replicated tensors differed from the copy "
        f"written for every rank ({detail}), so their own values were never saved. Replicated state (a DDP model, its "
        "optimizer) is saved once for all ranks, which needs every rank to hold the same values: a loop that changes one "
        "rank's parameters, gradients or optimizer state alone (gradients scaled per rank, noise from a per-rank or unseeded "
        "RNG) breaks that. Make those updates identical on every rank, or keep what must differ per rank in an extra "
        "(state_dict/load_state_dict); no checkpoint written while the copies differed can continue those ranks exactly."
    )


def pick(
    root: Path,
    world_size: int,
    training: dict | None,
    reshard: bool = False,
    verify: Verifier | None = None,
    cpu_capabilities: tuple[str, ...] | None = None,
    compiled: bool | None = None,
    gpus: tuple[str | None, ...] | None = None,
) -> tuple[str, dict, list[str]] | str | None:
    """(path, manifest, the newer checkpoints skipped as "step_N: why") of the checkpoint to resume, None to start
    fresh, or the error message to raise on every rank.

    `verify` verifies the files of each candidate (`verify_listed` by default); `cpu_capabilities`: every rank's torch
    CPU capability, in rank order (this process's alone by default); `compiled`: whether this attempt's model runs under
    torch.compile, `gpus`: every rank's GPU, in rank order (None: unknown)."""
    capabilities = cpu_capabilities or (torch.backends.cpu.get_cpu_capability(),)
    run = RunShape(
        world_size,
        training,
        torch.__version__,
        torch.get_num_threads(),
        strict_determinism(training),
        reshard,
        capabilities,
        compiled,
        gpus,
    )
    try:
        found = newest_usable(root, run, strict=True, verify=verify)
    except UsageError as exc:
        return str(exc)
    if found is None:
        return None
    if found.manifest["world_size"] != world_size:
        # Resharded: nothing to replay bitwise (a checkpoint held by its replay keeps the section naming its base's files).
        if bases.held_by_replay(found.manifest):
            return str(found.path), found.manifest, list(found.skipped)
        return str(found.path), {k: v for k, v in found.manifest.items() if k != "replay"}, list(found.skipped)
    # newest_usable verified the base of a checkpoint held by its replay already (it skips one whose base fails): not twice.
    unusable = None if bases.held_by_replay(found.manifest) else bases.problem(found.path, found.manifest, verify)
    if unusable is None:
        return str(found.path), found.manifest, list(found.skipped)
    log.warning(
        "checkpoint %s: %s; resuming from the checkpoint itself, verified by its digests but without a replay", found.path, unusable
    )
    return str(found.path), {k: v for k, v in found.manifest.items() if k != "replay"}, list(found.skipped)


def resting_on(path: Path, manifest: dict) -> list[tuple[Path, dict]]:
    """The (directory, files) checkpoint `path` rests on as `pick` returned it: its own files, and its replay base's on disk
    elsewhere where it kept its replay: what `pick` verifies of the checkpoint it returns."""
    listed = [(path, manifest["files"])]
    base = manifest.get("replay", {}).get("base")
    if base is not None:
        listed.append((path.parent / base["dir"], base["files"]))
    return listed


def replay_needed(path: Path, manifest: dict, cause: str, fix: str) -> str:
    """The refusal of a resume that cannot replay a checkpoint whose state is held by its replay."""
    return (
        f"Checkpoint {path} is a stop checkpoint: it holds its state at step {manifest['step']} only as its replay base "
        f"(step {manifest['replay']['from_step']}) and the records of the steps since, so resuming it means replaying those "
        f"steps and proving step {manifest['step']} bit for bit. This run cannot replay: {cause}. {fix}"
    )


def strict_determinism(training: dict | None) -> bool:
    """determinism.mode from the run's settings; for a Session used without a config, whether torch runs deterministic."""
    mode = (training or {}).get("determinism", {}).get("mode")
    return mode == "strict" if mode is not None else torch.are_deterministic_algorithms_enabled()


def _check_data_position(path: Path, states: dict, position: Position, how: str) -> None:
    """The restored data position is the checkpoint's step within its epoch, or the data that feeds it changed: another
    batch size puts the same samples at another step, and the run would go on from elsewhere in its data."""
    saved = states["counters"]["step_in_epoch"] if "counters" in states else position.step_in_epoch
    if position.step_in_epoch != saved:
        raise UsageError(
            f"Checkpoint {path} stopped at step {saved} of its epoch, but {how} its data position is step {position.step_in_epoch}: "
            "the global batch (per-rank batch x ranks) or the dataset changed since it was written. Keep those of the run that "
            "wrote it, so the data position stays exact, or start a new run directory."
        )
