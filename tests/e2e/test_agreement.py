"""The default, auto-spaced agreement: a signal to one rank still gives one agreed stop and an exact resume."""

from __future__ import annotations

import pytest
from conftest import FAST_GPT, TINY_GPT, assert_bitwise_equal, manifest, resumed_steps, run_to_completion

STEPS = 200
# Auto spacing aims at one agreement a second: the stopped run's steps take at least 20 ms (the bits unchanged), so
# two intervals after the signal at step 6 end well before its last step on any machine.
PACED = "chaos.step_sleep_s=0.02"
AUTO = tuple(s for s in FAST_GPT if not s.startswith(("checkpoint.agree_every_steps", "train.steps"))) + (
    "checkpoint.agree_every_steps=0",
    f"train.steps={STEPS}",
)


@pytest.mark.slow
def test_auto_spaced_agreement_stops_within_two_intervals_and_resumes_exactly(tmp_path) -> None:
    reference = tmp_path / "reference"
    run_to_completion(TINY_GPT, reference, *AUTO)
    resumed = tmp_path / "resumed"
    attempts = run_to_completion(TINY_GPT, resumed, *AUTO, PACED, "chaos.signal_rank=1", "chaos.signal_at_steps=[6]")
    assert [a.returncode for a in attempts] == [75, 0]
    stop = resumed_steps(attempts)[0]
    assert stop > 6
    assert manifest(resumed, stop)["reason"] == "signal"
    assert_bitwise_equal(reference, resumed, STEPS)
