"""The replicated state spread over the ranks: each rank writes its share once, every rank reads all back.

A fast unit test of the layout's logic: the "ranks" here are calls of
`layout.files` with each rank number in one process (a fake: no process group;
the 2-rank runs with real processes are in tests/e2e/test_spread_writes.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from legato.errors import UsageError
from legato.state.components import Component
from legato.state.file_names import MODEL_FILE, TRAIN_STATE_FILE
from legato.state.hashing import digest
from legato.store import commit, layout


def table() -> list[Component]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.Linear(128, 64))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 3)
    return [
        Component("model", model, MODEL_FILE, per_rank_keys=lambda: {n for n, _ in model.named_buffers()}),
        Component("optimizer", optimizer, TRAIN_STATE_FILE),
        Component("scheduler", scheduler, TRAIN_STATE_FILE),
    ]


def write(directory: Path, world_size: int, prefix: str = "", rows: list[Component] | None = None) -> dict[int, dict[str, dict]]:
    rows = table() if rows is None else rows
    parts = {c.name: c.obj.state_dict() for c in rows}
    return {rank: commit.write_files(directory, layout.files(rows, parts, rank, prefix, world_size)) for rank in range(world_size)}


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_writes_a_balanced_share_and_every_rank_restores_all_of_it(tmp_path: Path, world_size: int) -> None:
    rows = table()
    written = write(tmp_path, world_size, rows=rows)
    tensors = {rank: sum(info["bytes"] for name, info in files.items() if not name.startswith("rank")) for rank, files in written.items()}
    assert all(f"shared{rank}.pt" in written[rank] for rank in range(world_size))
    assert set(written[0]) >= {"model.pt", "train_state.pt"} and not any("model.pt" in written[r] for r in range(1, world_size))
    assert max(tensors.values()) < 0.6 * sum(tensors.values())  # rank 0 used to write all of it
    expected = {c.name: digest(c.obj.state_dict()) for c in rows}
    for rank in range(world_size):
        states = layout.load(rows, tmp_path, rank)
        assert {name: digest(state) for name, state in states.items()} == expected


def test_model_file_stays_a_plain_state_dict(tmp_path: Path) -> None:
    rows = table()
    write(tmp_path, 2, rows=rows)
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    written = rows[0].obj.state_dict()
    assert loaded.keys() == written.keys()
    assert [k for k, v in written.items() if not torch.equal(loaded[k], v)] == []


def test_one_rank_keeps_the_old_layout(tmp_path: Path) -> None:
    assert set(write(tmp_path, 1)[0]) == {"model.pt", "train_state.pt", "rank0.pt"}


def test_a_missing_share_is_named(tmp_path: Path) -> None:
    write(tmp_path, 2, prefix="replay_")
    (tmp_path / "replay_shared1.pt").unlink()
    with pytest.raises(UsageError, match=r"lacks rank 1's share \(shared1.pt\)"):
        layout.load(table(), tmp_path, 0, prefix="replay_")
