"""The exit code of a local job's one task from its forked ranks' codes (logic only; the e2e layer runs the ranks):
submitit's controller restarts the job when the task exits with the requeue code, as it did when a rank's task did."""

from __future__ import annotations

import pytest

from legato.orchestrator.local_ranks import _task_code

REQUEUE = 144


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([0, 0, 0], 0),
        ([REQUEUE, REQUEUE], REQUEUE),
        ([REQUEUE, 1], REQUEUE),  # rank 0 requeued: a rank that then failed on its way out must not end the run
        ([1, REQUEUE], REQUEUE),
        ([0, 3], 3),
        ([75, 1], 75),  # the first failure in rank order
        ([0, -9], 137),  # killed by SIGKILL, as a shell reports it
    ],
)
def test_the_task_exits_with_the_requeue_code_when_any_rank_did_else_the_first_failure(codes: list[int], expected: int) -> None:
    assert _task_code(codes, REQUEUE) == expected
