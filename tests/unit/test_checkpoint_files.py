"""In-process tests of checkpoint files: one hash pass guards both the state and the bytes.

The state digests and the file hashes come from one pass over the tensor
bytes (legato.state.hashing.Digests); a reader checks a file from its bytes alone
(legato.store.manifest). Every flipped byte, wherever it lands, is caught and named.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from legato.files import WRITE_PIECE_BYTES
from legato.state import components as table
from legato.state import file_names
from legato.state.hashing import Digests, digest
from legato.store import commit, filehash, layout
from legato.store import manifest as manifests


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(300, 40, generator=g), "b": torch.randn(40, generator=g), "step": 7, "bf": torch.ones(8, dtype=torch.bfloat16)}


def test_file_hash_reuses_the_state_digests_and_verifies_from_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = state()
    seen = Digests()
    before = digest(value, seen)
    hashed: list[int] = []
    real = filehash.xxhash.xxh3_128

    class Counting:
        """Counts the bytes the writer hashes itself: the storages must not be among them."""

        def __init__(self) -> None:
            self.h = real()

        def update(self, data) -> None:
            hashed.append(memoryview(data).nbytes)
            self.h.update(data)

        def digest(self) -> bytes:
            return self.h.digest()

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(filehash.xxhash, "xxh3_128", Counting)
    info = commit.write_files(tmp_path, {"a.pt": value}, (seen,))["a.pt"]
    monkeypatch.undo()
    assert [length for _, length in info["segments"]] == [value["w"].nbytes]  # the 48000-byte storage; small ones are regions
    assert value["w"].nbytes not in hashed and sum(hashed) < info["bytes"] - value["w"].nbytes + 1000
    manifests._verify_file(tmp_path / "a.pt", info)
    loaded = filehash.load_file(tmp_path / "a.pt")
    assert digest(loaded) == before and torch.equal(loaded["w"], value["w"])


def test_without_known_digests_the_file_hash_is_the_same(tmp_path: Path) -> None:
    value = state()
    seen = Digests()
    digest(value, seen)
    with_known = commit.write_files(tmp_path, {"a.pt": value}, (seen,))["a.pt"]
    plain = commit.write_files(tmp_path, {"b.pt": value})["b.pt"]
    assert plain["segments"] == [] and plain["bytes"] == with_known["bytes"]
    manifests._verify_file(tmp_path / "a.pt", with_known)
    manifests._verify_file(tmp_path / "b.pt", plain)


def test_no_crc_pass_in_the_writer_threads(tmp_path: Path) -> None:
    """The file hash covers the bytes, so torch's own CRC32 pass is switched off in every thread that saves; torch's
    config overrides are thread-local, so a switch set around the threads would leave them computing it (it did)."""
    written = commit.write_files(tmp_path, {"a.pt": state(), "b.pt": {"x": torch.arange(5000.0)}})
    for name in written:
        with zipfile.ZipFile(tmp_path / name) as archive:
            records = [info for info in archive.infolist() if "/data/" in info.filename]
            assert records and all(info.CRC == 0 for info in records), name
    assert torch.equal(filehash.load_file(tmp_path / "b.pt")["x"], torch.arange(5000.0))


def test_a_big_storage_reaches_the_file_in_pieces_and_the_file_is_unchanged(tmp_path: Path) -> None:
    """torch.save hands a storage to its file in one write; the checkpoint writer passes it on in pieces of at most
    WRITE_PIECE_BYTES (one write of 2 MiB or more costs 4-5x on this project's machines), byte for byte the same file."""
    value = {"w": torch.arange(3 * WRITE_PIECE_BYTES // 4 + 5, dtype=torch.float32)}  # a storage of 3 pieces and 20 bytes

    class Recording(io.BytesIO):
        """A file that records the size of every write it is given."""

        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def write(self, data) -> int:
            self.sizes.append(memoryview(data).nbytes)
            return super().write(data)

    recorded = Recording()
    writer = filehash._HashingWriter(recorded, {})
    torch.save(value, writer)
    whole = io.BytesIO()
    torch.save(value, whole)
    assert recorded.getvalue() == whole.getvalue()
    assert max(recorded.sizes) == WRITE_PIECE_BYTES and recorded.sizes.count(WRITE_PIECE_BYTES) == 3
    written = commit.write_files(tmp_path, {"a.pt": value})["a.pt"]
    manifests._verify_file(tmp_path / "a.pt", written)
    assert torch.equal(filehash.load_file(tmp_path / "a.pt")["w"], value["w"])


def test_a_loaded_file_owns_its_memory_views_stay_views_and_nothing_stays_mapped(tmp_path: Path) -> None:
    """load_file reads through a mapping of the file and copies each storage out of it: two saved views of one storage
    come back as views of one copy, a saved Parameter and a state dict's `_metadata` come back as saved, and once
    loaded nothing refers to the file's mapping (an optimizer keeps the tensors load_state_dict hands it, and a mapped
    tensor would pin a pruned checkpoint's disk space and copy each page on its first in-place update)."""
    base = torch.arange(4096.0)
    model = torch.nn.Linear(64, 16)
    value = {
        "model": model.state_dict(),
        "param": torch.nn.Parameter(torch.ones(1024)),
        "views": [base[:2048], base[1024:]],
        "pair": (base, 3),
    }
    written = commit.write_files(tmp_path, {"a.pt": value})["a.pt"]
    manifests._verify_file(tmp_path / "a.pt", written)
    loaded = filehash.load_file(tmp_path / "a.pt")
    first, second = loaded["views"]
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr() == loaded["pair"][0].untyped_storage().data_ptr()
    assert torch.equal(first, base[:2048]) and torch.equal(second, base[1024:]) and second.storage_offset() == 1024
    assert isinstance(loaded["param"], torch.nn.Parameter) and loaded["param"].requires_grad
    assert loaded["model"]._metadata == value["model"]._metadata
    assert digest(loaded) == digest(value)
    maps = Path("/proc/self/maps").read_text()
    assert str(tmp_path / "a.pt") not in maps, "a loaded tensor still refers to the file's mapping"


def mapped_files(directory: Path) -> set[str]:
    """The names of the files under `directory` that this process maps."""
    return {Path(line.split(maxsplit=5)[-1]).name for line in Path("/proc/self/maps").read_text().splitlines() if str(directory) in line}


def test_a_restored_model_is_copied_from_the_mapping_and_the_optimizer_keeps_memory_of_its_own(tmp_path: Path) -> None:
    """The module's state dict is read straight from model.pt's mapping (load_state_dict copies it into the parameters);
    everything else owns its memory, as the optimizer keeps the tensors it is handed. Once restored, nothing maps a file."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()

    def rows(module: torch.nn.Module, opt: torch.optim.Optimizer) -> list[table.Component]:
        return [
            table.Component("model", module, file_names.MODEL_FILE, per_rank_keys=lambda: {n for n, _ in module.named_buffers()}),
            table.Component("optimizer", opt, file_names.TRAIN_STATE_FILE),
        ]

    saved = table.capture(rows(model, optimizer))
    commit.write_files(tmp_path, layout.files(rows(model, optimizer), saved, rank=0))
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    states = layout.load(rows(fresh, fresh_optimizer), tmp_path, rank=0)
    assert mapped_files(tmp_path) == {file_names.MODEL_FILE}, "only the module's state may stay on the mapping until restored"
    table.restore(rows(fresh, fresh_optimizer), states, skips=lambda name: False, last=False, source=tmp_path)
    del states
    assert mapped_files(tmp_path) == set(), "a restored tensor still refers to a checkpoint file's mapping"
    assert table.digests(table.capture(rows(fresh, fresh_optimizer))) == table.digests(saved)


@pytest.mark.parametrize("where", [0, 0.25, 0.5, 0.75, -1])
def test_a_flipped_byte_anywhere_is_caught_naming_the_file(tmp_path: Path, where: float) -> None:
    value = state()
    seen = Digests()
    digest(value, seen)
    info = commit.write_files(tmp_path, {"rank1.pt": value}, (seen,))["rank1.pt"]
    path = tmp_path / "rank1.pt"
    data = bytearray(path.read_bytes())
    data[int(where * len(data)) if where >= 0 else len(data) - 1] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"^rank1\.pt does not match its XXH3-128 in the manifest"):
        manifests._verify_file(path, info)


def test_truncated_file_and_forged_segments_are_refused(tmp_path: Path) -> None:
    info = commit.write_files(tmp_path, {"m.pt": state()})["m.pt"]
    path = tmp_path / "m.pt"
    with pytest.raises(ValueError, match="malformed segments for m.pt"):
        manifests._verify_file(path, {**info, "segments": [[10, info["bytes"]]]})
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="m.pt does not match the manifest: it has .* bytes, the manifest says"):
        manifests._verify_file(path, info)


def test_an_empty_file_verifies_and_a_file_emptied_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    nothing = manifests.xxhash.xxh3_128(manifests.region_record("G", 0, manifests.xxhash.xxh3_128_digest(b""))).hexdigest()
    manifests._verify_file(tmp_path / "empty", {"bytes": 0, "segments": [], manifests.HASH_KEY: nothing})
    info = commit.write_files(tmp_path, {"m.pt": state()})["m.pt"]
    (tmp_path / "m.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="m.pt does not match the manifest: it has 0 bytes"):
        manifests._verify_file(tmp_path / "m.pt", info)


def test_digest_cache_follows_the_memory_not_the_name() -> None:
    seen = Digests()
    t = torch.arange(1000, dtype=torch.float32)
    first = digest({"w": t}, seen)
    assert digest({"other": t}, seen) != first  # names count
    assert digest({"w": t.clone()}) == first  # the cache changes nothing but the work
    assert digest({"w": t[1:]}, seen) != first  # a view is hashed itself, never mistaken for its storage


class _Held:
    """A Stateful holding one plain dict (a fake of a component, for the layout logic only)."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def test_a_sharded_component_goes_to_a_file_its_own_rank_writes(tmp_path: Path) -> None:
    from legato.errors import UsageError
    from legato.state.components import Component
    from legato.state.file_names import RANK_FILE, SHARD_FILE, TRAIN_STATE_FILE
    from legato.store import layout

    table = [Component("model", _Held({}), SHARD_FILE), Component("counters", _Held({}), TRAIN_STATE_FILE), Component("rng", _Held({}))]
    assert layout.writes(1, SHARD_FILE) and layout.writes(1, RANK_FILE) and not layout.writes(1, TRAIN_STATE_FILE)
    for rank in (0, 1):
        parts = {"model": {"w": torch.full((2,), float(rank))}, "counters": {"step": 3}, "rng": {"r": rank}}
        files = layout.files(table, parts, rank)
        assert set(files) == {f"rank{rank}.pt", f"model.shard{rank}.pt"} | ({"train_state.pt"} if rank == 0 else set())
        assert "model" not in files[f"rank{rank}.pt"]
        for name, state in files.items():
            torch.save(state, tmp_path / name)
    for rank in (0, 1):
        states = layout.load(table, tmp_path, rank)
        assert torch.equal(states["model"]["w"], torch.full((2,), float(rank))) and states["rng"] == {"r": rank}
    (tmp_path / "model.shard1.pt").unlink()
    with pytest.raises(UsageError, match="no shard file model.shard1.pt for model"):
        layout.load(table, tmp_path, 1)
