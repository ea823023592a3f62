"""Published checkpoints as files: list them, read a manifest, and verify it and the files it lists.

Which of them a run can continue from is legato.store.resumable's question.

Reads only JSON and file bytes, never imports torch and never unpickles
anything, so `legato status` and the supervisor can use it cheaply. Writing
checkpoints is `legato.store.checkpoint`'s job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeGuard

import xxhash

from legato.errors import UsageError
from legato.paths import CHECKPOINT_MANIFEST, STEP_PREFIX, TMP_STEP_PREFIX
from legato.store.manifest_schema import FILE_HASH_KEY, check_manifest

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
        suffix = path.name[len(STEP_PREFIX) :]
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
                combined.update(region_record("S", length, xxhash.xxh3_128_digest(data[offset : offset + length])))
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


def _int_pair(item: object) -> TypeGuard[list[int]]:
    """Whether `item` is a list of two ints (a bool is no int)."""
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)


def _segments(name: str, segments: object, size: int) -> list[tuple[int, int]]:
    """The manifest's segments of a file, checked to be ordered, disjoint and inside it."""
    checked, pos = [], 0
    for item in segments if isinstance(segments, list) else [None]:
        if not _int_pair(item) or item[0] < pos or item[1] < 0 or item[0] + item[1] > size:
            raise ValueError(f"{CHECKPOINT_MANIFEST} lists malformed segments for {name} (not written by legato)")
        checked.append((item[0], item[1]))
        pos = item[0] + item[1]
    return checked
