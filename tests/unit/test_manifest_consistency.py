"""A manifest that disagrees with itself is skipped like a corrupt file, never resumed as verified: a global hash
that its own rank hashes do not give, a rank hash that its own component digests do not give. A field of the wrong
type is named with its type. Each fault is planted in a real checkpoint written by the commit protocol, with the
manifest's checksum recomputed, as an editor (or a forger) would."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from legato.state.hashing import digest, global_hash, rank_hash
from legato.store import checkpoint as ckpt
from legato.store import manifest as manifests
from legato.store.resumable import newest_usable


def write(root: Path, step: int) -> Path:
    state = {"weight": torch.arange(6, dtype=torch.float32) * step}
    components = {"model": digest(state), "optimizer": digest({"lr": 0.1})}
    share = ckpt.RankShare(0, {"rank0.pt": state}, components, rank_hash(components))
    ckpt.write_checkpoint(root, step, share, 1, None, {"threads": 1}, keep_last=5)
    return root / f"step_{step}"


def rewrite(path: Path, change) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    manifest["manifest_sha256"] = manifests.manifest_checksum(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def newest_with_warnings(root: Path, caplog: pytest.LogCaptureFixture) -> tuple[int | None, str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="legato.store.manifest"):
        found = newest_usable(root)
    return (None if found is None else found.step), caplog.text


def set_global_hash(m: dict) -> None:
    m["global_hash"] = "0" * 32


def set_rank_hash_and_a_matching_global_hash(m: dict) -> None:
    m["ranks"][0]["hash"] = "1" * 32
    m["global_hash"] = global_hash(["1" * 32])


def set_replay_base_hash(m: dict) -> None:
    m["replay"] = {"from_step": 2, "ranks": [{"rank": 0, "hash": "2" * 32, "components": {"model": "3" * 32}}]}


@pytest.mark.parametrize(
    ("plant", "needle"),
    [
        (set_global_hash, "states global_hash '00000000000000000000000000000000', but its own rank hashes combine to"),
        (set_rank_hash_and_a_matching_global_hash, "for ranks[0], but its own component digests give"),
        (set_replay_base_hash, "for replay.ranks[0], but its own component digests give"),
    ],
)
def test_a_manifest_whose_hashes_disagree_is_skipped_with_a_message(tmp_path: Path, caplog, plant, needle: str) -> None:
    root = tmp_path / "checkpoints"
    write(root, 2)
    newest = write(root, 4)
    assert newest_with_warnings(root, caplog) == (4, "")
    rewrite(newest, plant)
    step, warnings = newest_with_warnings(root, caplog)
    assert step == 2, "the older consistent checkpoint is the one resumed"
    found = newest_usable(root)
    assert found is not None and len(found.skipped) == 1 and found.skipped[0].startswith("step_4: ") and needle in found.skipped[0]
    assert f"skipping checkpoint {newest}" in warnings and needle in warnings and "disagrees with itself" in warnings
    with pytest.raises(ValueError, match="disagrees with itself"):
        manifests.read_manifest(newest)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("world_size", "1", "world_size is a str ('1'), not an int"),
        ("world_size", True, "world_size is a bool (True), not an int"),
        ("step", 4.0, "step is a float (4.0), not an int"),
        ("torch_version", 2, "torch_version is an int (2), not a str"),
        ("ranks", {"0": {}}, "ranks is a dict ("),
        ("threads", "1", "threads is a str ('1'), not an int"),
        ("training", [1], "training is a list ([1]), not a dict"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_its_type(tmp_path: Path, caplog, field: str, value: object, needle: str) -> None:
    root = tmp_path / "checkpoints"
    newest = write(root, 4)
    rewrite(newest, lambda m: m.update({field: value}))
    step, warnings = newest_with_warnings(root, caplog)
    assert step is None and needle in warnings, warnings


def test_wrong_types_inside_ranks_and_files_are_named(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    newest = write(root, 4)
    plants = [
        (lambda m: m["ranks"][0].update(rank="0"), "ranks[0].rank is a str ('0'), not an int"),
        (lambda m: m["ranks"][0]["components"].update(model=7), "ranks[0].components['model'] is an int (7), not a str"),
        (lambda m: m["files"]["rank0.pt"].update(bytes="12"), "files['rank0.pt'].bytes is a str ('12'), not an int"),
        (lambda m: m["files"].update({"rank0.pt": "x"}), "files['rank0.pt'] is a str ('x'), not a dict"),
        (lambda m: m.pop("global_hash"), "has no global_hash"),
        (lambda m: m["ranks"][0].update(diverged=["model:0"]), "ranks[0].diverged is a list (['model:0']), not a dict"),
        (
            lambda m: m["ranks"][0].update(diverged={"tensors": ["model:0"], "writers": ["1"]}),
            "ranks[0].diverged.writers holds something other than ints",
        ),
        (lambda m: m["ranks"][0].update(diverged={"writers": [1]}), "has no ranks[0].diverged.tensors"),
        (lambda m: m["ranks"][0].update(cpu_capability=512), "ranks[0].cpu_capability is an int (512), not a str"),
    ]
    original = (newest / "manifest.json").read_text()
    for plant, needle in plants:
        (newest / "manifest.json").write_text(original)
        rewrite(newest, plant)
        with pytest.raises(ValueError) as caught:
            manifests.read_manifest(newest)
        assert needle in str(caught.value)


def test_the_manifest_reader_stays_torch_free() -> None:
    code = "import sys, legato.store.manifest; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    ("plant", "needle"),
    [
        (lambda m: m.update(state_by_replay=True), "state at step 4 is held by its replay (state_by_replay), but it has no replay base"),
        (lambda m: m.update(state_by_replay="yes"), "state_by_replay is a str ('yes'), not a bool"),
    ],
)
def test_a_checkpoint_held_by_its_replay_without_a_base_is_refused(tmp_path: Path, plant, needle: str) -> None:
    """A stop checkpoint holds its state only as its replay: the flag without a replay base before its step is no checkpoint."""
    newest = write(tmp_path / "checkpoints", 4)
    rewrite(newest, plant)
    with pytest.raises(ValueError) as caught:
        manifests.read_manifest(newest)
    assert needle in str(caught.value)
