"""Published checkpoints as files: list them, verify a manifest and its files, pick the newest usable one,
and decide whether one can continue this run. The training identity rule lives here, once.

Reads only JSON and file bytes, never imports torch and never unpickles
anything, so `legato status` and the supervisor can use it cheaply. Writing
checkpoints is `legato.store.checkpoint`'s job.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

import xxhash

from legato.errors import UsageError
from legato.paths import CHECKPOINT_MANIFEST, STEP_PREFIX, TMP_STEP_PREFIX
from legato.store.manifest_schema import FILE_HASH_KEY, check_manifest
from legato.store.trajectory_changes import trajectory_changes
from legato.treediff import changed_leaves

log = logging.getLogger(__name__)

FORMAT = 2  # 2: XXH3-128 digests and region-wise file hashes (1 was SHA-256 of whole files)
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
HASH_KEY = FILE_HASH_KEY
# How a reader verifies the files a manifest lists in a directory (name -> {bytes, hash, segments}): raises naming the
# first bad one. `verify_listed` by default; a Session's ranks verify them together (legato.session.file_checks).
Verifier = Callable[[Path, dict], None]


def region_record(kind: str, size: int, digest: bytes) -> bytes:
    """What one region of a file contributes to its hash: G (bytes between segments) or S (a tensor storage)."""
    return kind.encode() + size.to_bytes(8, "little") + digest


def manifest_checksum(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON without this field: a flipped digit must not pass."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory, from its name."""
    return int(path.name.removeprefix(STEP_PREFIX))


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories, newest step first."""
    found = []
    for path in root.glob(f"{STEP_PREFIX}*"):
        suffix = path.name[len(STEP_PREFIX):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return [p for _, p in sorted(found, reverse=True)]


def check_contained(root: Path, path: Path) -> None:
    """Refuse (UsageError) a checkpoint path that is a symlink or leads outside the run directory: nothing is written through it.

    `root` itself (`<run_dir>/checkpoints`) may be a link within the run directory; anything under it may not be a link at all.
    """
    if not os.path.lexists(path):
        return
    if path == root:
        outside = not path.resolve().is_relative_to(root.parent.resolve())
    else:
        outside = path.is_symlink() or not path.resolve().is_relative_to(root.resolve())
    if outside:
        raise UsageError(
            f"{path} is a symlink (to {path.resolve()}); legato reads and writes checkpoints only inside the run directory "
            f"{root.parent}, never through a link. Remove the link (`rm {path}`) and run again."
        )


def check_tree(root: Path) -> None:
    """Before a run starts: refuse a checkpoint directory holding a link, wherever it points."""
    check_contained(root, root)
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((STEP_PREFIX, TMP_STEP_PREFIX)):
            check_contained(root, entry)
            if entry.is_dir():
                for inner in sorted(entry.iterdir()):
                    check_contained(root, inner)


def read_manifest_file(path: Path) -> dict:
    """The manifest JSON of checkpoint directory `path`, unverified; raises ValueError naming what is wrong."""
    if path.is_symlink() or (path / CHECKPOINT_MANIFEST).is_symlink():
        raise ValueError("it is a symlink (legato reads nothing outside the run directory)")
    try:
        if (path / CHECKPOINT_MANIFEST).stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{CHECKPOINT_MANIFEST} is larger than {MAX_MANIFEST_BYTES // 2**20} MiB (not written by legato)")
        return json.loads((path / CHECKPOINT_MANIFEST).read_text())
    except FileNotFoundError:
        raise ValueError(f"no {CHECKPOINT_MANIFEST} (incomplete checkpoint)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{CHECKPOINT_MANIFEST} is not valid JSON ({exc})") from None


def read_manifest(path: Path, verify: Verifier | None = None) -> dict:
    """The manifest of checkpoint directory `path`, after checking its fields' types and that its stated hashes agree
    with each other (`manifest_schema`), then verifying every file it lists (with `verify`, `verify_listed` by default).

    Raises ValueError naming what is wrong.
    """
    manifest = read_manifest_file(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{CHECKPOINT_MANIFEST} is not a legato checkpoint manifest of format {FORMAT}")
    if manifest.get("manifest_sha256") != manifest_checksum(manifest):
        raise ValueError(f"{CHECKPOINT_MANIFEST} does not match its own checksum (corrupt)")
    check_manifest(manifest)
    (verify or verify_listed)(path, manifest["files"])
    return manifest


def verify_listed(directory: Path, files: dict) -> None:
    """Verify each file a manifest lists (name -> {bytes, hash, segments}) in `directory`; raises ValueError naming the first bad one."""
    for name, info in files.items():
        _verify_file(_listed_path(directory, name), info)


def check_listed(directory: Path, files: dict) -> None:
    """Check each file a manifest lists in `directory` without reading its bytes: present, a plain file, of its size, its
    segments well formed. What a reader checks before loading files that it verifies (`verify_listed`) right after, from
    the page cache the load filled. Raises ValueError naming the first bad one, as `verify_listed` does."""
    for name, info in files.items():
        path = _listed_path(directory, name)
        _check_present(path)
        _check_size(path, info["bytes"], path.stat().st_size)
        _segments(path.name, info.get("segments", []), info["bytes"])


def _listed_path(directory: Path, name: object) -> Path:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"{CHECKPOINT_MANIFEST} names the file {name!r}, which is not a plain name inside the checkpoint")
    return directory / name


def _check_present(path: Path) -> None:
    """A listed file is a plain file inside the run directory."""
    if path.is_symlink():
        raise ValueError(f"{path.name} is a symlink (legato reads nothing outside the run directory)")
    if not path.is_file():
        raise ValueError(f"{path.name} is missing")


def _check_size(path: Path, size: int, actual: int) -> None:
    """A listed file has the size the manifest says."""
    if actual != size:
        raise ValueError(f"{path.name} does not match the manifest: it has {actual} bytes, the manifest says {size} (truncated)")


def _verify_file(path: Path, info: dict) -> None:
    """Recompute a file's hash region by region from its bytes (one hash pass over the mapped page cache: no copy) and compare."""
    size = info["bytes"]
    _check_present(path)
    segments = _segments(path.name, info.get("segments", []), size)
    combined = xxhash.xxh3_128()
    with open(path, "rb") as f:
        _check_size(path, size, os.fstat(f.fileno()).st_size)
        with _mapped(f, size) as data:
            pos = 0
            for offset, length in segments:
                combined.update(region_record("G", offset - pos, xxhash.xxh3_128_digest(data[pos:offset])))
                combined.update(region_record("S", length, xxhash.xxh3_128_digest(data[offset:offset + length])))
                pos = offset + length
            combined.update(region_record("G", size - pos, xxhash.xxh3_128_digest(data[pos:size])))
    if combined.hexdigest() != info[HASH_KEY]:
        raise ValueError(f"{path.name} does not match its XXH3-128 in the manifest (corrupt)")


@contextmanager
def _mapped(f: BinaryIO, size: int) -> Iterator[memoryview]:
    """The file's `size` bytes (checked against the manifest just before) as a read-only view of its mapping.

    Hashing the mapping reads the page cache in place, where reading into a buffer first copied every byte (2x the time at
    256 MiB). Published checkpoint files are never rewritten, only removed, which leaves a mapping intact.
    """
    if size == 0:
        yield memoryview(b"")
        return
    with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            yield view
        finally:
            view.release()


def _segments(name: str, segments: object, size: int) -> list[tuple[int, int]]:
    """The manifest's segments of a file, checked to be ordered, disjoint and inside it."""
    checked, pos = [], 0
    for item in segments if isinstance(segments, list) else [None]:
        ok = isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        if not ok or item[0] < pos or item[1] < 0 or item[0] + item[1] > size:
            raise ValueError(f"{CHECKPOINT_MANIFEST} lists malformed segments for {name} (not written by legato)")
        checked.append((item[0], item[1]))
        pos = item[0] + item[1]
    return checked


class Found(NamedTuple):
    """A published checkpoint whose manifest and files verify: its directory and manifest."""

    path: Path
    manifest: dict

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
    for path in candidates:
        try:
            found = Found(path, read_manifest(path, verify))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping checkpoint %s: %s", path, exc)
            continue
        unusable = _base_problem(found, verify)
        if unusable is not None:
            log.warning("skipping checkpoint %s: its state is held by its replay, and %s", path, unusable)
            continue
        if run is not None:
            check_compatible(found.manifest, path, run.world_size, run.training, run.torch_version, run.threads, run.strict, run.reshard,
                             run.cpu_capabilities, compiled=run.compiled, gpus=run.gpus)
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
    from legato.store import bases

    return bases.problem(found.path, found.manifest, verify) if bases.held_by_replay(found.manifest) else None


def installed_torch_version() -> str:
    """torch's version as `torch.__version__` spells it, read without importing torch."""
    return importlib.metadata.version("torch")


def check_compatible(
    manifest: dict, path: Path, world_size: int, training: dict | None, torch_version: str, threads: int | None = None, strict: bool = True,
    reshard: bool = False, cpu_capabilities: Sequence[str] | None = None, compiled: bool | None = None,
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
    from legato.store.reshard import refusal

    written = manifest["world_size"]
    if not reshard:
        raise UsageError(
            f"Checkpoint {path} was written by {written} ranks, but this run has {world_size}. "
            "Bitwise continuation needs the same world size (it fixes the reduction order): run with "
            f"{written} ranks, or use a new run directory to start over. An FSDP2 run that must go on with {world_size} ranks can "
            "opt into continuing resharded (data position exact, not bitwise): checkpoint.reshard: true in the config, or "
            "CheckpointPolicy(reshard=True) in a Session."
        )
    problem = refusal(manifest)
    if problem is not None:
        raise UsageError(f"Checkpoint {path} was written by {written} ranks and this run has {world_size}: {problem}. Run with "
                         f"{written} ranks, or use a new run directory to start over.")


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
        fix = "set determinism.mode: fast" if by_config else "call seed_everything(seed, rank, mode=\"fast\")"
        raise UsageError(f"{message}, or {fix} to continue with a warning.")
    log.warning("%s. Continuing because %s is fast: the resumed run is not bitwise the uninterrupted one.", message, mode)
