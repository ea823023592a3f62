"""Which published checkpoint a run continues from: the newest whose files verify, and whether it can continue this
run bit for bit (world size, torch, threads, CPU kernels, training settings). The training identity rule lives here,
once.

Reads only JSON and file bytes, never imports torch and never unpickles anything, so `legato status` and the
supervisor can use it cheaply.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from legato.errors import UsageError
from legato.state.file_names import MODEL_FILE
from legato.store import bases
from legato.store.manifest import Verifier, list_checkpoints, read_manifest
from legato.store.manifest_schema import BY_REPLAY
from legato.store.trajectory_changes import trajectory_changes
from legato.treediff import changed_leaves

log = logging.getLogger(__name__)


class Found(NamedTuple):
    """A published checkpoint whose manifest and files verify: its directory and manifest, and the newer checkpoints
    passed over to reach it, each as "step_N: why"."""

    path: Path
    manifest: dict
    skipped: tuple[str, ...] = ()

    @property
    def step(self) -> int:
        return self.manifest["step"]


@dataclass(frozen=True)
class RunShape:
    """What a checkpoint must match to continue a run bit for bit (see `check_compatible`)."""

    world_size: int
    training: dict | None
    torch_version: str
    threads: int | None = None
    strict: bool = True
    reshard: bool = False  # checkpoint.reshard: another world size continues resharded (FSDP2 only), not bitwise
    cpu_capabilities: tuple[str, ...] | None = None  # each rank's torch CPU capability, in rank order; None where unknown
    compiled: bool | None = None  # whether the model runs under torch.compile; None where unknown (before the script runs)
    gpus: tuple[str | None, ...] | None = None  # each rank's GPU (legato.state.device_kind), in rank order; None where unknown


def newest_usable(root: Path, run: RunShape | None = None, *, strict: bool = False, verify: Verifier | None = None) -> Found | None:
    """The newest checkpoint under `root` whose manifest and files verify (with `verify`, `verify_listed` by default);
    each skipped one is named in a warning.

    With `run`, the one found must be able to continue that run (UsageError otherwise: an older one would
    silently drop progress). `strict`: checkpoints exist but none verifies is a UsageError too, as a run
    that started over would replace them. None: nothing to resume.
    """
    candidates = list_checkpoints(root)
    skipped: list[str] = []
    for path in candidates:
        try:
            found = Found(path, read_manifest(path, verify), tuple(skipped))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping checkpoint %s: %s", path, exc)
            skipped.append(f"{path.name}: {exc}")
            continue
        unusable = _base_problem(found, verify)
        if unusable is not None:
            log.warning("skipping checkpoint %s: its state is held by its replay, and %s", path, unusable)
            skipped.append(f"{path.name}: its state is held by its replay, and {unusable}")
            continue
        if run is not None:
            check_compatible(
                found.manifest,
                path,
                run.world_size,
                run.training,
                run.torch_version,
                run.threads,
                run.strict,
                run.reshard,
                run.cpu_capabilities,
                compiled=run.compiled,
                gpus=run.gpus,
            )
        return found
    if strict and candidates:
        raise UsageError(
            f"None of the {len(candidates)} checkpoints in {root} verifies (see the warnings above), so this run "
            "cannot resume, and starting over would replace them. Restore the files, or move the run directory "
            "away (or pick a new run.dir) to start from step 0."
        )
    return None


def _base_problem(found: Found, verify: Verifier | None) -> str | None:
    """Why a checkpoint whose state is held by its replay cannot be resumed (its base is unusable), or None."""
    return bases.problem(found.path, found.manifest, verify) if bases.held_by_replay(found.manifest) else None


def installed_torch_version() -> str:
    """torch's version as `torch.__version__` spells it, read without importing torch."""
    return importlib.metadata.version("torch")


def check_compatible(
    manifest: dict,
    path: Path,
    world_size: int,
    training: dict | None,
    torch_version: str,
    threads: int | None = None,
    strict: bool = True,
    reshard: bool = False,
    cpu_capabilities: Sequence[str] | None = None,
    compiled: bool | None = None,
    gpus: Sequence[str | None] | None = None,
) -> None:
    """Raise a UsageError when checkpoint `path` cannot continue this run bit for bit (or, opted into by `reshard`, resharded).

    A different torch thread count, or a rank whose CPU kernels use another instruction set (`cpu_capabilities`, each
    rank's in rank order), is refused when `strict`, and only warned about otherwise.
    """
    if manifest["world_size"] != world_size:
        _check_reshard(manifest, path, world_size, reshard)
        _check_global_batch(manifest, path, world_size, training)
    if manifest["torch_version"] != torch_version:
        raise UsageError(
            f"Checkpoint {path} was written with torch {manifest['torch_version']}, this is torch {torch_version}. "
            "RNG state layouts and kernels differ between versions; resume with the torch that wrote it, or start a new run directory."
        )
    by_config = training is not None
    for change in trajectory_changes(manifest, path, threads, cpu_capabilities, compiled, gpus, by_config):
        _refuse_or_warn(change, strict, by_config)
    saved = manifest.get("training")
    if saved is None or saved == training:
        return
    keys = [key for key, _, _ in changed_leaves(saved, training)]
    if manifest["world_size"] != world_size:
        # Resharding (refused above unless opted into): the per-rank batch follows the world size, the global batch checked above.
        keys = [key for key in keys if key != BATCH_KEY]
    if keys:
        raise UsageError(
            f"Run directory {path.parent.parent} belongs to another training config: {', '.join(keys)} differ from "
            "the checkpoint. Use the config that started this run, or a new run.dir."
        )


BATCH_KEY = "train.batch_size"  # per rank: the one training setting a resharded resume may change, keeping the global batch


def global_batch_kept(saved: dict, training: dict | None, old: int, new: int) -> bool:
    """Whether training settings `training` at `new` ranks keep the global batch (per-rank batch x ranks) of `saved` at `old`."""
    before, after = saved.get("train", {}).get("batch_size"), (training or {}).get("train", {}).get("batch_size")
    return before is not None and after is not None and before * old == after * new


def _check_reshard(manifest: dict, path: Path, world_size: int, reshard: bool) -> None:
    """Refuse another world size unless opted into resharding, and then for a checkpoint that cannot be resharded."""
    written = manifest["world_size"]
    if not reshard:
        raise UsageError(
            f"Checkpoint {path} was written by {written} ranks, but this run has {world_size}. "
            "Bitwise continuation needs the same world size (it fixes the reduction order): run with "
            f"{written} ranks, or use a new run directory to start over. An FSDP2 run that must go on with {world_size} ranks can "
            "opt into continuing resharded (data position exact, not bitwise): checkpoint.reshard: true in the config, or "
            "CheckpointPolicy(reshard=True) in a Session."
        )
    problem = reshard_refusal(manifest)
    if problem is not None:
        raise UsageError(
            f"Checkpoint {path} was written by {written} ranks and this run has {world_size}: {problem}. Run with "
            f"{written} ranks, or use a new run directory to start over."
        )


def _check_global_batch(manifest: dict, path: Path, world_size: int, training: dict | None) -> None:
    """Refuse a resharded resume of a bundled-trainer run whose global batch would change (its data position would not be exact)."""
    saved, old = manifest.get("training"), manifest["world_size"]
    if saved is None or training is None or global_batch_kept(saved, training, old, world_size):
        return
    before = saved["train"]["batch_size"] * old
    raise UsageError(
        f"Checkpoint {path} was trained with a global batch of {before} ({saved['train']['batch_size']} per rank x {old} ranks); "
        f"with {world_size} ranks it would be {training['train']['batch_size'] * world_size}, and the data position would not be "
        f"exact. Keep the global batch (per-rank batch x ranks): train.batch_size: {before / world_size:g} for {world_size} ranks."
    )


def _refuse_or_warn(message: str, strict: bool, by_config: bool) -> None:
    """What a resume that would leave the trajectory does: a UsageError under strict determinism (its fix worded for a
    config, or for a script's own Session), a warning under fast."""
    mode = "determinism.mode" if by_config else "the determinism mode (seed_everything(mode=...))"
    if strict:
        fix = "set determinism.mode: fast" if by_config else 'call seed_everything(seed, rank, mode="fast")'
        raise UsageError(f"{message}, or {fix} to continue with a warning.")
    log.warning("%s. Continuing because %s is fast: the resumed run is not bitwise the uninterrupted one.", message, mode)


def reshard_refusal(manifest: dict) -> str | None:
    """Why checkpoint `manifest` cannot be resharded (it holds no FSDP2 shards, or DDP's replicated model), or None."""
    files = manifest.get("files", {})
    names = list(files) if isinstance(files, dict) else [str(f) for f in files]
    base = manifest.get("replay", {}).get("base") if manifest.get(BY_REPLAY) is True else None
    if isinstance(base, dict) and isinstance(base.get("files"), dict):
        names += list(base["files"])  # held by its replay: the state is its base's, in another checkpoint's directory
    if not any(".shard" in name for name in names) or any(name.endswith(MODEL_FILE) for name in names):
        return (
            "checkpoint.reshard applies to FSDP2 (fully_shard) checkpoints only; this one holds a replicated (DDP) model, "
            "whose buckets and ZeroRedundancyOptimizer shards are laid out for its world size"
        )
    return None
