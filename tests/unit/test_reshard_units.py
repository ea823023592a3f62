"""Resharding's pure logic (legato.store.reshard, resumable.check_compatible): plain records and manifests, no ranks.

The end-to-end proof with real ranks and signals is tests/e2e/test_reshard.py; these pin the arithmetic and the
refusals: each new chunk is the full tensor's rows FSDP2 gives that rank, a missing old shard is refused, a data
position that the new ranks cannot share evenly is refused, and another world size is refused without the opt-in
(naming it) and, with it, for a checkpoint holding a replicated (DDP) model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from legato.errors import UsageError
from legato.store import reshard
from legato.store.resumable import check_compatible

FULL = torch.arange(30, dtype=torch.float32).reshape(10, 3)


def records(full: torch.Tensor, world: int) -> list[dict]:
    """The records FSDP2 shards of `full` (dimension 0 over `world` ranks) become in a checkpoint."""
    out, start = [], 0
    for part in torch.chunk(full, world):
        out.append(
            {
                "local": part.clone(),
                "shape": list(full.shape),
                "local_shape": list(part.shape),
                "offsets": [start, 0],
                "placements": [["shard", 0]],
                "mesh": list(range(world)),
            }
        )
        start += part.shape[0]
    return out


@pytest.mark.parametrize("old, new", [(2, 3), (2, 4), (4, 2), (3, 4), (4, 12)])
def test_each_new_chunk_is_the_rows_fsdp2_gives_that_rank(old: int, new: int) -> None:
    saved = records(FULL, old)
    chunks = torch.tensor_split(FULL, [min(r * -(-10 // new), 10) for r in range(1, new)])
    for rank in range(new):
        record = reshard._chunk(saved, rank, new, "w")
        assert torch.equal(record["local"], chunks[rank]) and record["mesh"] == list(range(new))
        assert record["local_shape"] == list(chunks[rank].shape)


def test_a_missing_old_shard_is_refused() -> None:
    saved = records(FULL, 2)
    saved[1] = {**saved[0]}  # rank 1's file holding rank 0's chunk: rows 5..10 are nowhere
    with pytest.raises(UsageError, match="do not cover rows 5..10"):
        reshard._chunk(saved, 1, 2, "w")


def test_the_data_position_is_the_samples_consumed_re_divided() -> None:
    assert reshard._data({"seed": 7, "epoch": 1, "position": 8}, 2, 4) == {"seed": 7, "epoch": 1, "position": 4}
    assert reshard._data({"seed": 7, "epoch": 1, "position": 2}, 4, 2) == {"seed": 7, "epoch": 1, "position": 4}
    # The dataset's length, which the data position holds since 2026-11-27, goes along unchanged.
    assert reshard._data({"seed": 7, "epoch": 1, "position": 8, "samples": 96}, 2, 4) == {
        "seed": 7,
        "epoch": 1,
        "position": 4,
        "samples": 96,
    }
    with pytest.raises(UsageError, match="cannot share evenly"):
        reshard._data({"seed": 7, "epoch": 0, "position": 5}, 2, 4)
    with pytest.raises(UsageError, match="resumable loader"):
        reshard._data({"epoch": 0, "step_in_epoch": 3, "opened": {}}, 2, 4)


def manifest(*files: str) -> dict:
    return {"world_size": 2, "torch_version": "2.13.0", "files": {name: {} for name in files}}


def test_another_world_size_is_refused_without_the_opt_in_and_for_ddp_state() -> None:
    path = Path("/r/checkpoints/step_5")
    fsdp2 = manifest("rank0.pt", "model.shard0.pt", "model.shard1.pt")
    with pytest.raises(UsageError, match=r"checkpoint.reshard: true in the config, or CheckpointPolicy\(reshard=True\)"):
        check_compatible(fsdp2, path, 4, None, "2.13.0")
    check_compatible(fsdp2, path, 4, None, "2.13.0", reshard=True)
    with pytest.raises(UsageError, match="FSDP2 .fully_shard. checkpoints only"):
        check_compatible(manifest("rank0.pt", "model.pt", "train_state.pt"), path, 4, None, "2.13.0", reshard=True)


def test_the_per_rank_batch_may_change_with_the_opt_in_only_when_the_global_batch_is_kept() -> None:
    path = Path("/r/checkpoints/step_5")
    saved = {**manifest("rank0.pt", "model.shard0.pt"), "training": {"train": {"batch_size": 8, "lr": 1}}}
    halved, kept_lr = {"train": {"batch_size": 4, "lr": 1}}, {"train": {"batch_size": 8, "lr": 1}}
    check_compatible(saved, path, 4, halved, "2.13.0", reshard=True)
    with pytest.raises(UsageError, match=r"global batch of 16 \(8 per rank x 2 ranks\); with 4 ranks it would be 32"):
        check_compatible(saved, path, 4, kept_lr, "2.13.0", reshard=True)
    with pytest.raises(UsageError, match="another training config: train.lr differ"):
        check_compatible(saved, path, 4, {"train": {"batch_size": 4, "lr": 2}}, "2.13.0", reshard=True)


def test_verify_names_a_resharded_resume_when_its_runs_differ() -> None:
    from legato.orchestrator.reports import verdict_lines
    from legato.orchestrator.verify import Verdict

    resumes = [
        {"step": 5, "match": True, "mismatches": {}, "replay": None, "job_id": None, "restart": 1, "resharded": {"from": 2, "to": 4}}
    ]
    verdict = Verdict(False, 36, 2, resumes, "a", "b", 0, cause="the resume at step 5")
    assert "legato: the resume at step 5 was resharded 2 -> 4 ranks: data position exact, not bitwise" in verdict_lines(verdict, None)


def test_a_stop_checkpoint_held_by_its_replay_is_judged_by_its_base_files() -> None:
    """Its own files are none when its base is another checkpoint's: the base's files say FSDP2 or DDP."""
    path = Path("/r/checkpoints/step_5")

    def held(*base_files: str) -> dict:
        base = {"dir": "step_4", "prefix": "", "files": {name: {} for name in base_files}}
        return {**manifest(), "state_by_replay": True, "replay": {"from_step": 4, "ranks": [], "base": base}}

    check_compatible(held("rank0.pt", "model.shard0.pt", "model.shard1.pt"), path, 4, None, "2.13.0", reshard=True)
    with pytest.raises(UsageError, match="FSDP2 .fully_shard. checkpoints only"):
        check_compatible(held("rank0.pt", "model.pt", "train_state.pt"), path, 4, None, "2.13.0", reshard=True)
    with pytest.raises(UsageError, match="FSDP2 .fully_shard. checkpoints only"):
        check_compatible(manifest("replay_rank0.pt", "replay_model.pt"), path, 4, None, "2.13.0", reshard=True)
