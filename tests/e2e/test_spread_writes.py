"""The replicated state is written once, spread over both ranks; a rank's lost share makes its checkpoint unusable.

Real processes (2 ranks, gloo, the tiny GPT under `legato`), a real stop. The
manifest records which rank wrote which file; deleting rank 1's share of the
newest checkpoint, or flipping a bit inside one of its tensors (a file that
still loads: the resume loads before it verifies), is the planted fault: the
resume must skip that checkpoint, naming the file, fall back to the previous
one and still end bitwise equal to an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST_GPT, TINY_GPT, assert_bitwise_equal, gpt_reference, manifest, resumed_steps, run_to_completion, run_trainer
from helpers.shared_runs import SharedRuns

pytestmark = pytest.mark.slow

STEPS = 30
EVERY = "checkpoint.every_steps=5"


@pytest.fixture
def reference(shared_runs: SharedRuns) -> Path:
    return gpt_reference(shared_runs)


def plant(share: Path, info: dict, fault: str) -> str:
    """Remove the share, or flip a bit in the middle of its largest tensor; what the resume's warning must say of it."""
    if fault == "missing":
        share.unlink()
        return "shared1.pt is missing"
    offset, length = max(info["segments"], key=lambda segment: segment[1])
    data = bytearray(share.read_bytes())
    data[offset + length // 2] ^= 0x04
    share.write_bytes(bytes(data))
    return "shared1.pt does not match its XXH3-128 in the manifest (corrupt)"


@pytest.mark.parametrize("fault", ["missing", "altered"])
def test_each_rank_writes_its_share_and_a_lost_share_falls_back(reference: Path, tmp_path: Path, fault: str) -> None:
    # verify "warn": the stop checkpoint holds its own state (under "error" only its replay base, spread the same way).
    stopped = run_trainer(TINY_GPT, tmp_path, *FAST_GPT, EVERY, "chaos.signal_at_steps=[12]", "checkpoint.verify=warn")
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    m = manifest(tmp_path, 13)
    wrote = {r["rank"]: r["wrote"] for r in m["ranks"]}
    assert {"model.pt", "train_state.pt", "shared0.pt", "rank0.pt"} <= set(wrote[0])
    assert {"shared1.pt", "rank1.pt"} <= set(wrote[1]) and "model.pt" not in wrote[1]
    replicated = {r: sum(m["files"][n]["bytes"] for n in names if not n.startswith(("rank", "replay_"))) for r, names in wrote.items()}
    assert replicated[1] > 0.5 * replicated[0], replicated  # rank 0 used to write all of it
    named = plant(tmp_path / "checkpoints" / "step_13" / "shared1.pt", m["files"]["shared1.pt"], fault)
    attempts = run_to_completion(TINY_GPT, tmp_path, *FAST_GPT, EVERY)
    assert f"skipping checkpoint {tmp_path / 'checkpoints' / 'step_13'}: {named}" in attempts[0].stderr
    assert resumed_steps(attempts) == [10]
    assert_bitwise_equal(reference, tmp_path, STEPS)
