"""What a checkpoint manifest must hold before anything trusts it: every field a reader uses, of the right type,
file names that stay inside the checkpoint, and stated hashes that agree with each other.

A rank's `hash` must be the rank hash of its own component digests, and the
`global_hash` the global hash of the rank hashes (the same rule the writer
used, `legato.state.digest_rule`); a manifest that disagrees with itself is
refused like a corrupt file, so it can never be resumed as verified. Fields a
reader does not use (a writer may add its own) are left alone. It must never
import torch, read a file or raise anything but ValueError.
"""

from __future__ import annotations

from typing import Any

from legato.paths import CHECKPOINT_MANIFEST
from legato.state.digest_rule import global_hash, rank_hash

# In a rank's entry (and its replay base's): its replicated tensors that differed from the copy written for every rank.
DIVERGED = "diverged"

FILE_HASH_KEY = "xxh3_128"  # each file's XXH3-128, region by region
# true: the checkpoint holds no state of its own at its step, only its replay base; a resume must replay to prove it
BY_REPLAY = "state_by_replay"
# In a rank's entry: torch.backends.cpu.get_cpu_capability() as it wrote (AVX2, AVX512, ...), its CPU kernels' instruction set
CPU_CAPABILITY_KEY = "cpu_capability"
# Each rank's GPU as it wrote, in rank order (legato.state.device_kind: "NVIDIA H100 80GB HBM3 (sm_90)"), null for a CPU rank
GPUS_KEY = "gpus"
# {"cuda": rule, "elsewhere": rule}: which rule digested a tensor, by the device it lived on (legato.state.hashing); absent
# in checkpoints that predate the device rule, whose GPU tensors were digested by XXH3 on the host
TENSOR_DIGESTS_KEY = "tensor_digests"
# true: the run's model ran under torch.compile (in part or whole) when it wrote; absent in checkpoints that predate it
COMPILED_KEY = "model_compiled"
# {"step", "components", "how"}: the run went on past a resume that did not verify (LEGATO_RESUME=unverified); carried by
# every later checkpoint, so no later resume claims bitwise continuity with the run's start
UNVERIFIED_KEY = "unverified"
# The names of the objects the census found unsaved in this run so far ("ema", "saver"): a resume verifies without them
UNREGISTERED_KEY = "unregistered"
SHOWN_CHARS = 40


def check_manifest(manifest: dict) -> None:
    """Raise ValueError naming the first field of the wrong type, or the first stated hash that disagrees."""
    _expect(manifest, "step", int, minimum=0)
    world_size = _expect(manifest, "world_size", int, minimum=1)
    _expect(manifest, "torch_version", str)
    _expect(manifest, "global_hash", str)
    _optional(manifest, "threads", int)
    _optional(manifest, "training", dict)
    _optional(manifest, COMPILED_KEY, bool)
    _optional(manifest, TENSOR_DIGESTS_KEY, dict)
    _optional(manifest, UNVERIFIED_KEY, dict)
    _optional(manifest, UNREGISTERED_KEY, list)
    for index, gpu in enumerate(_optional(manifest, GPUS_KEY, list) or []):
        if gpu is not None and not isinstance(gpu, str):
            raise ValueError(_wrong_type(f"{GPUS_KEY}[{index}]", gpu, "str"))
    ranks = _ranks("ranks", manifest.get("ranks"), world_size)
    files = _expect(manifest, "files", dict)
    for name, info in files.items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\x00" in name:
            raise ValueError(f"{CHECKPOINT_MANIFEST} names the file {name!r}, which is not a plain name inside the checkpoint")
        where = f"files[{name!r}]"
        if not isinstance(info, dict):
            raise ValueError(_wrong_type(where, info, "dict"))
        _expect(info, "bytes", int, minimum=0, where=where)
        _expect(info, FILE_HASH_KEY, str, where=where)
    replay = _optional(manifest, "replay", dict)
    if replay is not None:
        _expect(replay, "from_step", int, minimum=0, where="replay")
        _ranks("replay.ranks", replay.get("ranks"), world_size)
    if _optional(manifest, BY_REPLAY, bool) and (replay is None or replay["from_step"] >= manifest["step"]):
        raise ValueError(
            f"{CHECKPOINT_MANIFEST} says its state at step {manifest['step']} is held by its replay ({BY_REPLAY}), but it has no "
            "replay base before that step (edited or corrupt)"
        )
    computed = global_hash([r["hash"] for r in ranks])
    if manifest["global_hash"] != computed:
        raise ValueError(
            f"{CHECKPOINT_MANIFEST} states global_hash {_shown(manifest['global_hash'])}, but its own rank hashes combine to "
            f"{computed} (the manifest disagrees with itself: edited or corrupt)"
        )


def _ranks(where: str, ranks: Any, world_size: int) -> list[dict]:
    """One entry per rank, in rank order, each with a hash that its own component digests give."""
    if not isinstance(ranks, list):
        raise ValueError(_wrong_type(where, ranks, "list"))
    if len(ranks) != world_size:
        raise ValueError(f"{CHECKPOINT_MANIFEST} lists {len(ranks)} entries in {where} for world_size {world_size} (not written by legato)")
    for index, entry in enumerate(ranks):
        at = f"{where}[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(_wrong_type(at, entry, "dict"))
        if "rank" in entry and _expect(entry, "rank", int, where=at) != index:
            raise ValueError(f"{CHECKPOINT_MANIFEST}: {at} says rank {entry['rank']} (not written by legato)")
        _expect(entry, "hash", str, where=at)
        _optional(entry, CPU_CAPABILITY_KEY, str, where=at)
        components = _expect(entry, "components", dict, where=at)
        for name, value in components.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(_wrong_type(f"{at}.components[{_shown(name)}]", value, "str"))
        if DIVERGED in entry:
            _diverged(f"{at}.{DIVERGED}", entry[DIVERGED])
        if entry["hash"] != rank_hash(components):
            raise ValueError(
                f"{CHECKPOINT_MANIFEST} states hash {_shown(entry['hash'])} for {at}, but its own component digests give "
                f"{rank_hash(components)} (the manifest disagrees with itself: edited or corrupt)"
            )
    return ranks


def _diverged(where: str, value: Any) -> None:
    """A rank's replicated tensors that differed from their writer's copy (legato.state.recipes): names and writer ranks."""
    if not isinstance(value, dict):
        raise ValueError(_wrong_type(where, value, "dict"))
    for key, kind in (("tensors", str), ("writers", int)):
        items = _expect(value, key, list, where=where)
        if not all(isinstance(i, kind) and not isinstance(i, bool) for i in items):
            raise ValueError(f"{CHECKPOINT_MANIFEST}: {where}.{key} holds something other than {kind.__name__}s (not written by legato)")


def _expect(holder: dict, key: str, kind: type[Any], *, minimum: int | None = None, where: str = "") -> Any:
    """`holder[key]`, which must be a `kind` (a bool is no int) and at least `minimum`."""
    name = f"{where}.{key}" if where and key != where else key
    if key not in holder:
        raise ValueError(f"{CHECKPOINT_MANIFEST} has no {name} (not written by legato)")
    value = holder[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(_wrong_type(name, value, kind.__name__))
    if minimum is not None and value < minimum:
        raise ValueError(f"{CHECKPOINT_MANIFEST}: {name} is {value}, below {minimum} (not written by legato)")
    return value


def _optional(holder: dict, key: str, kind: type, where: str = "") -> Any:
    """`holder[key]` when present and not null, checked like `_expect`; else None."""
    return None if holder.get(key) is None else _expect(holder, key, kind, where=where)


def _wrong_type(name: str, value: Any, expected: str) -> str:
    found = type(value).__name__
    return f"{CHECKPOINT_MANIFEST}: {name} is {_a(found)} ({_shown(value)}), not {_a(expected)} (not written by legato)"


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
