"""Interrupted-and-resumed runs end bit for bit where uninterrupted runs end.

Real processes (2 ranks, gloo), real signals: `chaos.signal_at_steps` makes
rank 1 alone send itself SIGUSR2 after the listed step; the ranks agree to
stop after the next step, write a barrier checkpoint and exit 75; the same
command then resumes, with its state hash verified.
"""

from __future__ import annotations

import pytest
from conftest import FAST_GPT, MLP, TINY_GPT, assert_bitwise_equal, gpt_reference, manifest, resumed_steps, run_to_completion
from helpers.shared_runs import SharedRuns

STEPS = 30


@pytest.fixture
def references(shared_runs: SharedRuns) -> dict:
    """Uninterrupted runs, one per worker count, made once per suite (2 workers: the config's own, as other modules run it)."""
    return {0: gpt_reference(shared_runs, "train.num_workers=0"), 2: gpt_reference(shared_runs)}


def stop_scenarios(steps_per_epoch: int) -> dict[str, list[int]]:
    """Name -> steps after which the ranks stop (the signal comes one step earlier)."""
    return {
        "early": [2],
        "mid_epoch": [steps_per_epoch // 2 + 1],
        "epoch_boundary": [steps_per_epoch],
        "one_before_end": [STEPS - 1],
        "twice_in_a_row": [5, steps_per_epoch + 3],
    }


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("scenario", ["early", "mid_epoch", "epoch_boundary", "one_before_end", "twice_in_a_row"])
def test_resumed_run_is_bitwise_identical(references: dict, gpt_steps_per_epoch: int, tmp_path, scenario: str, workers: int) -> None:
    stops = stop_scenarios(gpt_steps_per_epoch)[scenario]
    assert all(0 < s < STEPS for s in stops)
    signals = [s - 1 for s in stops]
    attempts = run_to_completion(
        TINY_GPT, tmp_path, *FAST_GPT, f"train.num_workers={workers}", "chaos.signal_rank=1", f"chaos.signal_at_steps={signals}"
    )
    assert [a.returncode for a in attempts] == [75] * len(stops) + [0]
    assert resumed_steps(attempts) == stops
    assert_bitwise_equal(references[workers], tmp_path, STEPS)


@pytest.mark.slow
def test_mlp_with_batchnorm_and_mixup_resumes_exactly(tmp_path) -> None:
    sets = ("train.steps=24", "checkpoint.every_steps=0", "checkpoint.hash_every_steps=4")
    reference = tmp_path / "reference"
    run_to_completion(MLP, reference, *sets)
    resumed = tmp_path / "resumed"
    attempts = run_to_completion(MLP, resumed, *sets, "chaos.signal_rank=0", "chaos.signal_at_steps=[9]")
    assert resumed_steps(attempts) == [10]
    assert_bitwise_equal(reference, resumed, 24)


@pytest.mark.slow
def test_amp_with_grad_scaler_resumes_exactly(tmp_path) -> None:
    sets = (*FAST_GPT, "train.steps=16", "train.amp=true")
    reference = tmp_path / "reference"
    run_to_completion(TINY_GPT, reference, *sets)
    assert "scaler" in manifest(reference, 16)["ranks"][0]["components"]
    resumed = tmp_path / "resumed"
    attempts = run_to_completion(TINY_GPT, resumed, *sets, "chaos.signal_at_steps=[6]")
    assert resumed_steps(attempts) == [7]
    assert_bitwise_equal(reference, resumed, 16)
