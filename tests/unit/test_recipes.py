"""A rank that copies only its share still knows every digest: the completed recipes are `digest()` bit for bit.

In one process, no group: each "rank" lays out its own copy of a DDP-style
state (identical replicated model and AdamW state, per-rank batch-norm
buffers, per-rank counters) with legato.store.layout, snapshots only its
files (legato.state.snapshot.Snapshot, as the replay base and the staging of
an asynchronous checkpoint do), and the shares of all ranks are completed as
the leader completes the reports. The same digests over real processes and
disks: e2e/test_async_checkpoint_runs.py and the replay tests.
"""

from __future__ import annotations

import copy

import pytest
import torch

from legato.state import hashing, recipes, snapshot
from legato.state.components import Component
from legato.state.file_names import MODEL_FILE, RANK_FILE, TRAIN_STATE_FILE
from legato.state.hashing import digest
from legato.state.snapshot import Snapshot
from legato.store import commit, layout
from legato.store.manifest_schema import DIVERGED

PER_RANK = {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}


class Counters:
    """Per-rank plain state with a small tensor, as a Session's own rows hold."""

    def __init__(self, rank: int) -> None:
        self.state = {"step": 5, "lr": 0.1 * (rank + 1), "seen": torch.arange(3) + rank}

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(3)
    model = torch.nn.Sequential()
    model.add_module("fc", torch.nn.Linear(48, 64))
    model.add_module("norm", torch.nn.BatchNorm1d(64))
    model.add_module("head", torch.nn.Linear(64, 40))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 48)).square().mean().backward()
    optimizer.step()
    return model, optimizer


def rank_rows(base: tuple[torch.nn.Module, torch.optim.Optimizer], rank: int) -> list[Component]:
    """Rank `rank`'s table: the replicated model and optimizer as DDP keeps them, its own batch-norm buffers and counters."""
    model = copy.deepcopy(base[0])
    model.norm.running_mean.add_(rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(base[1].state_dict())
    return [
        Component("model", model, MODEL_FILE, per_rank_keys=lambda: PER_RANK),
        Component("optimizer", optimizer, TRAIN_STATE_FILE),
        Component("counters", Counters(rank), RANK_FILE),
    ]


def snapshots(world: int, drift: int | None = None) -> tuple[list[dict], list[Snapshot]]:
    """Each rank's true digests and its snapshot; rank `drift`'s replicated head weight is one ulp off the others'."""
    base = trained()
    states, snaps = [], []
    for rank in range(world):
        rows = rank_rows(base, rank)
        if rank == drift:
            with torch.no_grad():
                rows[0].obj.head.weight[3, 5] = torch.nextafter(rows[0].obj.head.weight[3, 5], torch.tensor(1.0))
        parts = {c.name: c.obj.state_dict() for c in rows}
        files = layout.files(rows, parts, rank, world_size=world)
        snap = Snapshot()
        snap.take(9, parts, files, layout.for_everyone(files, rank))
        states.append({name: digest(value) for name, value in parts.items()})
        snaps.append(snap)
    return states, snaps


def digests(completed: list[recipes.Completed]) -> list[dict[str, str]]:
    return [c.components for c in completed]


def tensor_bytes(tree: object) -> int:
    return sum(t.nbytes for t in layout._tensors(tree))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_completed_shares_are_every_rank_s_digests_bit_for_bit(world: int) -> None:
    expected, snaps = snapshots(world)
    completed = recipes.complete([s.share() for s in snaps])
    assert digests(completed) == expected and not any(c.diverged for c in completed)
    # Per-rank values make the ranks' digests differ where they should: the model (its buffers) and the counters.
    if world > 1:
        assert expected[0]["model"] != expected[1]["model"] and expected[0]["optimizer"] == expected[1]["optimizer"]


def test_each_rank_copies_its_share_not_the_replicated_state() -> None:
    world = 4
    _, snaps = snapshots(world)
    copied = [tensor_bytes(s.files) for s in snaps]
    whole = tensor_bytes(trained()[0].state_dict()) + tensor_bytes(trained()[1].state_dict())
    # Rank 0 writes model.pt (and its share of the optimizer); every other rank a part of the optimizer state only.
    assert all(c < whole for c in copied) and sum(copied) < 1.1 * whole
    assert "model.pt" in snaps[0].files and all("model.pt" not in s.files for s in snaps[1:])


def test_the_share_is_of_the_step_taken_not_of_the_live_state_that_moved_on() -> None:
    base = trained()
    rows = rank_rows(base, 0)
    parts = {c.name: c.obj.state_dict() for c in rows}
    before = {name: digest(value) for name, value in parts.items()}
    files = layout.files(rows, parts, 0)
    snap = Snapshot()
    snap.take(1, parts, files, layout.for_everyone(files, 0))
    with torch.no_grad():
        rows[0].obj.fc.weight.add_(1.0)
    assert digests(recipes.complete([snap.share()])) == [before]


def test_a_reference_no_rank_filled_is_an_error_never_a_default() -> None:
    _, snaps = snapshots(2)
    shares = [s.share() for s in snaps]
    dropped = {**shares[1], recipes.REPLICATED: dict(list(shares[1][recipes.REPLICATED].items())[1:])}
    with pytest.raises(ValueError, match="no rank reported the digest of tensor"):
        recipes.complete([shares[0], dropped])


def test_a_planted_wrong_digest_changes_the_completed_digest_and_two_writers_that_disagree_are_refused() -> None:
    expected, snaps = snapshots(2)
    shares = [s.share() for s in snaps]
    key = next(iter(shares[1][recipes.REPLICATED]))
    planted = {**shares[1], recipes.REPLICATED: {**shares[1][recipes.REPLICATED], key: "00" * 16}}
    completed = digests(recipes.complete([shares[0], planted]))
    assert completed != expected
    assert completed[0][key.split(":")[0]] != expected[0][key.split(":")[0]]  # rank 0's digest names the fault too
    twice = {**shares[0], recipes.REPLICATED: {**shares[0][recipes.REPLICATED], key: "00" * 16}}
    with pytest.raises(ValueError, match="two ranks wrote tensor"):
        recipes.complete([twice, shares[1]])


def test_reports_are_completed_for_the_state_and_the_replay_base_and_carry_no_share_into_the_manifest() -> None:
    expected, snaps = snapshots(2)
    reports = [
        commit.report(r, "", {}, {}, {"rank": r, "from_step": 9, recipes.SHARE: s.share(), "steps": []}, s.share())
        for r, s in enumerate(snaps)
    ]
    done = commit.complete(reports)
    assert [d["components"] for d in done] == expected == [d["replay"]["components"] for d in done]
    assert all(recipes.SHARE not in d and recipes.SHARE not in d["replay"] and d["hash"] == d["replay"]["hash"] for d in done)


def test_a_rank_whose_replicated_copy_differs_is_never_completed_with_the_writers_digest() -> None:
    """Planted fault: rank 1's copy of the model (written by rank 0) is one ulp off in one value. Its completed model digest
    must be neither its own (never hashed) nor rank 0's, the tensor is named with its writer, and the rest stays exact."""
    truth, snaps = snapshots(2, drift=1)
    writers_copy, _ = snapshots(2)
    completed = recipes.complete([s.share() for s in snaps])
    assert completed[0].components == truth[0] and not completed[0].diverged
    head = [k for k in snaps[1].share()[recipes.SUMS] if k.startswith("model:")]
    assert len(completed[1].diverged) == 1 and set(completed[1].diverged) <= set(head) and completed[1].writers == [0]
    assert completed[1].components["model"] not in (truth[1]["model"], writers_copy[1]["model"])
    assert {k: v for k, v in completed[1].components.items() if k != "model"} == {k: v for k, v in truth[1].items() if k != "model"}


def test_a_diverged_rank_is_named_in_its_report_and_its_replay_base_entry() -> None:
    _, snaps = snapshots(2, drift=1)
    reports = [
        commit.report(r, "", {}, {}, {"rank": r, "from_step": 9, recipes.SHARE: s.share(), "steps": []}, s.share())
        for r, s in enumerate(snaps)
    ]
    done = commit.complete(reports)
    assert DIVERGED not in done[0] and DIVERGED not in done[0]["replay"]
    assert done[1][DIVERGED] == done[1]["replay"][DIVERGED]
    assert done[1][DIVERGED]["writers"] == [0] and done[1][DIVERGED]["tensors"]


@pytest.mark.parametrize("on_device_from", [0, snapshot.LANES_ON_DEVICE_BYTES], ids=["lanes on the device", "small: rule on the copy"])
def test_a_live_tensor_s_device_rule_follows_it_into_the_snapshot_not_its_copy(
    monkeypatch: pytest.MonkeyPatch, on_device_from: int
) -> None:
    """A GPU tensor is digested by the device rule, and its snapshot on the host must report that digest (its lanes taken
    from the live tensor, or for a small one the rule run on its copy), not XXH3 of the copy. No GPU here: the live
    tensors stand in for GPU ones (the rule is chosen by their memory), their copies do not; the planted fault (a
    snapshot that lets the copy choose the rule) is caught."""
    monkeypatch.setattr(snapshot, "LANES_ON_DEVICE_BYTES", on_device_from)
    rows = rank_rows(trained(), 0)
    parts = {c.name: c.obj.state_dict() for c in rows}
    files = layout.files(rows, parts, 0)
    by_xxh3 = {name: digest(value) for name, value in parts.items()}
    live = {t.untyped_storage().data_ptr() for t in layout._tensors(parts)}

    def on_device(t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in live

    monkeypatch.setattr(hashing, "follows_device_rule", on_device)
    monkeypatch.setattr(snapshot, "follows_device_rule", on_device)
    expected = {name: digest(value) for name, value in parts.items()}
    assert all(expected[name] != by_xxh3[name] for name in expected)  # every component holds a tensor under the rule
    snap = Snapshot()
    snap.take(1, parts, files, layout.for_everyone(files, 0))
    monkeypatch.setattr(snapshot, "follows_device_rule", lambda t: False)  # planted: the copy on the host chooses the rule
    forgetful = Snapshot()
    forgetful.take(1, parts, files, layout.for_everyone(files, 0))
    assert digests(recipes.complete([forgetful.share()])) != [expected]
    with torch.no_grad():
        rows[0].obj.fc.weight.add_(1.0)  # the live state moves on: the lanes were taken at the step
    assert digests(recipes.complete([snap.share()])) == [expected]
