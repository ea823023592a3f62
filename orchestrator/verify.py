"""Proof that a config resumes bit for bit: compare an interrupted run against an uninterrupted one.

`plan_runs` derives the two runs' configs from the user's (same world size and
training settings; hashes of every component at every step; the interrupted
run gets the real stop signal after the chosen steps and continues past a
failed verification so that the divergence can be located). `compare_runs`
reads what two finished run directories wrote (trajectories, checkpoint
manifests, ledgers) and returns a `Verdict`: identical, or the first divergent
step with its rank and components and the likely cause in plain words.
Comparisons are of digests and `float.hex` strings only, never tolerances.
Both verify workflows (verify_config.py, verify_command.py) write into a fresh
directory and leave the same record there: `record_verdict`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from legato.config import KEEP_LAST_MAX, Config, config_from_dict, load_config, training_identity
from legato.errors import UsageError
from legato.events import Kind
from legato.orchestrator.ledger import Ledger
from legato.orchestrator.plot import plot_losses, replay_spans
from legato.paths import RunPaths
from legato.store.manifest import checkpoint_step, list_checkpoints, read_manifest_file
from legato.store.resumable import newest_usable
from legato.store.trajectory import read_trajectory
from legato.treediff import changed_leaves

RNG_WORDS = {"rng.python": "python's", "rng.numpy": "numpy's", "rng.torch": "torch's CPU", "rng.gen.loader": "the data loader's"}

# How a verification tells which of its runs starts: the phase ("reference" or "reused", "interrupted", "again") and its
# details.
Phase = Callable[[str, dict], None]


@dataclass
class Divergence:
    """The first step at which the interrupted run differs from the reference: its rank, components and losses."""

    step: int
    rank: int
    components: list[str]
    loss_differs: bool
    reference_loss: str | None = None
    run_loss: str | None = None


@dataclass
class Verdict:
    """The outcome of comparing an interrupted run with the reference: identical, or where and likely why not."""

    identical: bool
    steps: int
    world_size: int
    resumes: list[dict]
    reference_final_hash: str | None
    run_final_hash: str | None
    checkpoints_compared: int
    divergence: Divergence | None = None
    cause: str | None = None
    checkpoint_mismatches: list[int] = field(default_factory=list)
    unpinned_layouts: list[dict] = field(default_factory=list)  # attempts that reduced with DDP's own bucket layout
    # RNG components left out of the comparison: a script's unseeded global RNGs, different in any two of its runs
    unseeded: list[str] = field(default_factory=list)
    reference: str | None = None  # the reference run compared against, where it is not the verification's own reference/

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def diverged_before_resuming(self) -> bool:
        """The runs part before any resume: resuming cannot be the cause (a later resume may still fail, e.g. its replay
        meets the same non-determinism)."""
        d = self.divergence
        return d is not None and not any(r["step"] < d.step for r in self.resumes)


def interruption_steps(total: int, at: list[int] | None, count: int | None, seed: int) -> list[int]:
    """The steps after which to interrupt: the `at` steps, else `count` (default 1) steps drawn with `seed`, within 1..total-1."""
    if at:
        bad = [s for s in at if not 1 <= s < total]
        if bad:
            raise UsageError(f"--interrupt-at {bad[0]} is outside the run: pick steps from 1 to {total - 1} (train.steps is {total}).")
        return sorted(set(at))
    count = 1 if count is None else count
    if not 1 <= count < total:
        raise UsageError(f"--interruptions {count}: pick between 1 and {total - 1} for a run of {total} steps.")
    return sorted(random.Random(seed).sample(range(1, total), count))


def plan_runs(cfg: Config, out: Path, steps: list[int]) -> tuple[Config, Config]:
    """(reference, interrupted) configs for one verification under `out`."""
    base = cfg.to_dict()
    # Keep every checkpoint of both runs (at most one per step) so that all of them can be compared.
    base["checkpoint"].update(hash_every_steps=1, agree_every_steps=1, keep_last=min(cfg.train.steps + 1, KEEP_LAST_MAX), verify="warn")
    base["chaos"].update(preempt_every_s=0.0, kill_in_checkpoint=0)
    reference = json.loads(json.dumps(base))
    reference["run"]["dir"] = str(out / "reference")
    reference["chaos"].update(signal_at_steps=[], skip_restore=[], consume_rng_after_restore=[])
    interrupted = json.loads(json.dumps(base))
    interrupted["run"]["dir"] = str(out / "interrupted")
    interrupted["chaos"].update(signal_at_steps=steps, signal_rank=cfg.chaos.signal_rank % cfg.world_size)
    return config_from_dict(reference, "verify"), config_from_dict(interrupted, "verify")


def reused_reference(path: Path, planned: Config) -> Path:
    """`path` as the reference of this verification, instead of training it again: the finished, never resumed
    reference run of an earlier `legato verify` of the same training (`training_identity`), checkpoint settings
    (every step hashed and kept, as `plan_runs` sets them) and fault injection (none: all of `chaos` but the rank a
    signal would go to). A UsageError naming what differs otherwise."""
    path = path.resolve()
    captured = RunPaths(path).config
    if not captured.is_file():
        raise UsageError(
            f"--reference {path} holds no captured config: pass the reference/ folder an earlier legato verify of this config wrote."
        )
    saved = load_config(captured)
    differ = [key for key, _, _ in changed_leaves(training_identity(saved), training_identity(planned))]
    differ += [f"checkpoint.{key}" for key, _, _ in changed_leaves(saved.to_dict()["checkpoint"], planned.to_dict()["checkpoint"])]
    chaos = changed_leaves(_unsignalled(saved.to_dict()["chaos"]), _unsignalled(planned.to_dict()["chaos"]))
    differ += [f"chaos.{key}" for key, _, _ in chaos]
    if differ:
        raise UsageError(
            f"--reference {path} was trained with other settings ({', '.join(differ)} differ from this verification's "
            "reference): pass the reference/ folder of a verify of this same config and --set values, or leave --reference "
            "out to train one."
        )
    events = Ledger(path).read()
    if any(e.get("event") == Kind.RESUMED for e in events):
        raise UsageError(
            f"--reference {path} was interrupted and resumed: a reference trains in one attempt; pass a verify's reference/ folder."
        )
    if not any(e.get("event") == Kind.FINISHED for e in events):
        raise UsageError(
            f"--reference {path} has not finished: a reference must have trained every step; leave --reference out to train one."
        )
    return path


def _unsignalled(chaos: dict) -> dict:
    """A chaos section without `signal_rank`: a reference gets no signal, so the rank one would go to never acts."""
    return {k: v for k, v in chaos.items() if k != "signal_rank"}


def stale_reference(reference: Path, d: Divergence) -> str:
    """Why an interrupted run parts from a reused reference before any resume: not the resume."""
    return (
        f"the interrupted run already differs from the reused reference {reference} at step {d.step} (rank {d.rank}), before any "
        "resume: that reference was trained under another torch, thread count or CPU, or the computation is not "
        "deterministic. Verify again without --reference to tell which."
    )


def compare_runs(reference: Path, run: Path, unseeded: list[str] | None = None) -> Verdict:
    """Compare two finished run directories (trajectories, checkpoint manifests, ledgers) and return the Verdict.

    `unseeded` names RNG components to leave out (`unseeded_rngs` found them different between two uninterrupted
    runs): every other component and every loss bit is still compared, per component instead of by global hash.
    """
    ignore = sorted(unseeded or [])
    ref_ranks, run_ranks = _ranks(reference), _ranks(run)
    ref_final, run_final = _final(reference), _final(run)
    resumes = [
        {k: e.get(k) for k in ("step", "match", "mismatches", "replay", "job_id", "restart", "resharded")}
        for e in Ledger(run).read()
        if e["event"] == Kind.RESUMED
    ]
    unpinned = [
        {"run": label, **{k: e.get(k) for k in ("job_id", "restart", "step", "reason")}}
        for label, path in (("reference", reference), ("run", run))
        for e in Ledger(path).read()
        if e["event"] == Kind.BUCKET_LAYOUT and not e.get("pinned")
    ]
    compared, mismatched = _compare_checkpoints(reference, run, ignore)
    steps = (ref_final or {}).get("step", 0)
    verdict = Verdict(
        identical=False,
        steps=steps,
        world_size=len(ref_ranks),
        resumes=resumes,
        reference_final_hash=(ref_final or {}).get("global_hash"),
        run_final_hash=(run_final or {}).get("global_hash"),
        checkpoints_compared=compared,
        checkpoint_mismatches=mismatched,
        unpinned_layouts=unpinned,
        unseeded=ignore,
    )
    if len(ref_ranks) != len(run_ranks):
        verdict.cause = (
            f"world size changed: {len(ref_ranks)} ranks against {len(run_ranks)}. The data shards and the gradient "
            "reduction order depend on it, so no bitwise equality is possible; compare runs with the same world size."
        )
        return verdict
    verdict.divergence = first_divergence(reference, run, len(ref_ranks), ignore)
    complete = ref_final is not None and run_final is not None and ref_final.get("step") == run_final.get("step")
    same_end = complete and _same_state(ref_final, run_final, ignore)  # type: ignore[arg-type]
    if verdict.divergence is None and same_end and not mismatched:
        verdict.identical = True
        return verdict
    verdict.cause = diagnose(verdict, complete)
    return verdict


def first_divergence(a: Path, b: Path, world_size: int, ignore: list[str] | None = None) -> Divergence | None:
    """The earliest step at which any rank's loss bits or state digests (but those of `ignore`) differ between two runs."""
    found: Divergence | None = None
    for rank in range(world_size):
        left = {r["step"]: r for r in read_trajectory(RunPaths(a).trajectory(rank))}
        right = {r["step"]: r for r in read_trajectory(RunPaths(b).trajectory(rank))}
        for step in sorted(set(left) & set(right)):
            if found is not None and step >= found.step:
                break
            x, y = left[step], right[step]
            loss_differs = x.get("loss_hex") != y.get("loss_hex")
            hashes_differ = "state_hash" in x and "state_hash" in y and x["state_hash"] != y["state_hash"]
            cx, cy = x.get("components", {}), y.get("components", {})
            names = sorted(n for n in set(cx) | set(cy) if cx.get(n) != cy.get(n) and n not in (ignore or ()))
            if loss_differs or (hashes_differ and (names or not ignore)):
                found = Divergence(step, rank, names, loss_differs, x.get("loss_hex"), y.get("loss_hex"))
                break
    return found


def nondeterminism(reference: Path, again: Path, world_size: int, remedy: str = "determinism.mode: strict") -> str | None:
    """When two uninterrupted runs of the same config (or script) differ, say where; `remedy` names the switch to use."""
    d = first_divergence(reference, again, world_size)
    if d is None:
        return None
    return (
        f"a non-deterministic operation: two uninterrupted runs of the same config already differ at step {d.step} "
        f"(rank {d.rank}: {', '.join(d.components) or 'loss'}). Resuming cannot be exact until the computation is; look for "
        f"unseeded randomness or non-deterministic kernels ({remedy})."
    )


def unseeded_rngs(reference: Path, again: Path, world_size: int) -> list[str] | None:
    """The RNG components that differ between two uninterrupted runs whose every loss bit and every other component
    agree: a script's global RNGs that it never seeds (they start from os.urandom in every process) and training never
    draws from. None when anything else differs (the computation itself is not reproducible)."""
    differing: set[str] = set()
    for rank in range(world_size):
        left = {r["step"]: r for r in read_trajectory(RunPaths(reference).trajectory(rank))}
        right = {r["step"]: r for r in read_trajectory(RunPaths(again).trajectory(rank))}
        for step in sorted(set(left) & set(right)):
            x, y = left[step], right[step]
            if x.get("loss_hex") != y.get("loss_hex"):
                return None
            cx, cy = x.get("components", {}), y.get("components", {})
            differing |= {n for n in set(cx) | set(cy) if cx.get(n) != cy.get(n)}
    ends = _final(reference), _final(again)
    if None not in ends:
        for a, b in zip(ends[0]["ranks"], ends[1]["ranks"]):  # type: ignore[index]
            differing |= {n for n in set(a["components"]) | set(b["components"]) if a["components"].get(n) != b["components"].get(n)}
    if any(not n.startswith("rng.") for n in differing):
        return None
    return sorted(differing)


def rng_words(names: list[str]) -> str:
    """RNG components in words: "python's and numpy's RNG states (rng.python, rng.numpy)"."""
    names = sorted(names, key=lambda n: (list(RNG_WORDS).index(n) if n in RNG_WORDS else len(RNG_WORDS), n))
    words = [RNG_WORDS.get(n, "CUDA" if n.startswith("rng.cuda") else n) for n in names]
    return f"{' and '.join(words)} RNG states ({', '.join(names)})"


def diagnose(v: Verdict, complete: bool) -> str:
    """The likely cause of the first divergence, in plain words."""
    failed = [r for r in v.resumes if not r["match"]]
    if failed:
        first = failed[0]
        names = sorted({n for names in first["mismatches"].values() for n in names})
        replay = first.get("replay") or {}
        if not names and replay.get("first_divergence"):
            d = replay["first_divergence"]
            return (
                f"the resume at step {first['step']} failed its replay, which diverged first at step {d['step']} "
                f"(rank {d['rank']}): {d['cause']}."
            )
        return _unrestored(names, first["step"])
    d = v.divergence
    if d is None:
        if not complete:
            return "the interrupted run did not reach the end of training; see `legato status` of its run directory."
        return f"the trajectories agree but the checkpoints at steps {v.checkpoint_mismatches} or the final hashes differ."
    if v.diverged_before_resuming:
        return (
            f"the runs differ at step {d.step}, before any resume: the computation itself is not reproducible "
            "(a non-deterministic operation, or randomness from an unseeded source), so resuming is not the cause."
        )
    resumed_at = max(r["step"] for r in v.resumes if r["step"] < d.step)
    if _reduction_order(v, d, resumed_at):
        attempts = ", ".join(f"{u['run']} job {u['job_id']} restart {u['restart']} ({u['reason']})" for u in v.unpinned_layouts)
        where = f" The attempts that reduced with DDP's own, per-attempt bucket layout: {attempts}." if attempts else ""
        return (
            f"the restored state verified at step {resumed_at} and step {d.step} computed the same loss with the same "
            f"random numbers, yet ended with different {', '.join(d.components)}: the gradient all-reduce summed in another "
            f"order than the uninterrupted run did (reduction order: with {v.world_size} ranks the bits of a sum depend on "
            "where each gradient sits in DDP's buckets, and DDP rebuilds them after the first step of every attempt)."
            f"{where} Pass the DistributedDataParallel wrapper itself as the Session's model, so the Session saves its "
            "bucket layout and restores it on resume."
        )
    if d.step == resumed_at + 1 and (d.loss_differs or any(n.startswith("rng.") for n in d.components)):
        return (
            f"the restored state verified at step {resumed_at}, but the first resumed step {d.step} already differs "
            f"({', '.join(d.components) or 'loss'}): random numbers were drawn between the restore and the first step "
            "(the classic ordering bug: build the model, optimizer and loader first, restore RNG last, draw nothing after it)."
        )
    return (
        f"the restored state verified at step {resumed_at}, and the runs agree until step {d.step}: some state that "
        f"affects training is not in the checkpoint ({', '.join(d.components) or 'loss'} differ first). Pass it to the "
        "session as an extra (anything with state_dict/load_state_dict)."
    )


def _reduction_order(v: Verdict, d: Divergence, resumed_at: int) -> bool:
    """Same loss and RNG streams but another update (parameters, optimizer state, saved gradients), with 3+ ranks,
    and a layout that was not pinned (or unknown at the first resumed step)."""
    if v.world_size < 3 or d.loss_differs or not d.components or not set(d.components) <= {"model", "optimizer", "grads"}:
        return False
    return bool(v.unpinned_layouts) or d.step == resumed_at + 1


def _unrestored(names: list[str], step: int) -> str:
    rng = [n for n in names if n.startswith("rng.")]
    parts = []
    if rng:
        words = ", ".join(RNG_WORDS.get(n, "CUDA" if n.startswith("rng.cuda") else n) for n in rng)
        parts.append(f"an RNG component was not restored ({words} generator: {', '.join(rng)})")
    if "data" in names:
        parts.append("the sampler's epoch or position was not restored (the data order after the resume differs)")
    for name in ("optimizer", "scheduler", "scaler"):
        if name in names:
            parts.append(f"the {name} state is missing from the restore")
    if "model" in names:
        parts.append("the model weights were not restored")
    if "buckets" in names:
        parts.append(
            "DDP's gradient bucket layout was not restored (reduction order: with 3 or more ranks the resumed steps "
            "sum gradients in another order than the uninterrupted run)"
        )
    if "forward_sync" in names:
        parts.append(
            "DDP's forward-sync flag was not restored (the resumed step broadcasts rank 0's buffers where the run did not, or the reverse)"
        )
    rest = [
        n
        for n in names
        if not n.startswith("rng.")
        and n not in ("data", "optimizer", "scheduler", "scaler", "model", "counters", "metrics", "buckets", "forward_sync")
    ]
    if rest:
        parts.append(f"these components were not restored: {', '.join(rest)}")
    if not parts:
        parts.append(f"the restored {', '.join(names)} differ from what was saved")
    return (
        f"the resume at step {step} did not restore the saved state: " + "; ".join(parts) + f" (differing components: {', '.join(names)})."
    )


def fresh_directory(out: str | None, name: str) -> Path:
    """Where a verification goes: `out`, or runs/verify/<name>-<time>; a UsageError when it already holds anything."""
    path = Path(out or f"runs/verify/{name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if path.exists() and any(path.iterdir()):
        raise UsageError(f"{path} is not empty; give --out a new directory so no earlier result is overwritten.")
    return path


def plot_verdict(png: Path, runs: dict[str, Path], verdict: Verdict) -> Path | None:
    """The runs' loss curves with the verdict's resumes, replays and divergence marked; None without matplotlib."""
    divergence = verdict.divergence.step if verdict.divergence else None
    return plot_losses(png, runs, [r["step"] for r in verdict.resumes], divergence, replay_spans(verdict.resumes))


def record_verdict(verdict: Verdict, out: Path) -> Path | None:
    """Write out/loss.png (reference against interrupted) and out/verdict.json; the PNG's path, or None without matplotlib."""
    reference = Path(verdict.reference) if verdict.reference else out / "reference"
    png = plot_verdict(out / "loss.png", {"reference": reference, "interrupted": out / "interrupted"}, verdict)
    (out / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2) + "\n")
    return png


def final_step(run_dir: Path) -> int:
    """The step of a finished run's newest usable checkpoint (0 when it has none): how many steps the run trains."""
    final = _final(run_dir)
    return 0 if final is None else int(final["step"])


def _ranks(run_dir: Path) -> list[Path]:
    return sorted(RunPaths(run_dir).trajectories.glob("rank*.jsonl"))


def _final(run_dir: Path) -> dict | None:
    found = newest_usable(RunPaths(run_dir).checkpoints)
    return None if found is None else found.manifest


def _same_state(a: dict, b: dict, ignore: list[str]) -> bool:
    """Whether two checkpoint manifests hold the same state: the global hash, or without `ignore` every rank's components."""
    if not ignore:
        return a["global_hash"] == b["global_hash"]
    if len(a["ranks"]) != len(b["ranks"]):
        return False
    kept = [[{k: v for k, v in r["components"].items() if k not in ignore} for r in m["ranks"]] for m in (a, b)]
    return kept[0] == kept[1]


def _compare_checkpoints(a: Path, b: Path, ignore: list[str]) -> tuple[int, list[int]]:
    """Every step both runs checkpointed: (how many compared, the steps whose states differ but for `ignore`)."""
    left = {checkpoint_step(p): p for p in list_checkpoints(RunPaths(a).checkpoints)}
    right = {checkpoint_step(p): p for p in list_checkpoints(RunPaths(b).checkpoints)}
    mismatched = []
    common = sorted(set(left) & set(right))
    for step in common:
        if not _same_state(read_manifest_file(left[step]), read_manifest_file(right[step]), ignore):
            mismatched.append(step)
    return len(common), mismatched
