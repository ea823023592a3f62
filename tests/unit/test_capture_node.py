"""Which process of a script's launch captures its node's environment: each node's first rank, by what its launcher
set (a logic test of legato.repro.attempt.node_of; tests/e2e/test_script_capture.py runs real attempts)."""

from __future__ import annotations

import pytest

from legato.repro.attempt import node_of


@pytest.mark.parametrize(
    ("environ", "node"),
    [
        ({}, 0),  # plain python: one process
        ({"RANK": "0", "WORLD_SIZE": "2"}, 0),  # ranks started by hand name no local rank: one node
        ({"RANK": "1", "WORLD_SIZE": "2"}, None),
        ({"RANK": "4", "LOCAL_RANK": "0", "GROUP_RANK": "2"}, 2),  # torchrun's third node
        ({"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2"}, None),
        ({"SLURM_PROCID": "8", "SLURM_LOCALID": "0", "SLURM_NODEID": "3"}, 3),  # srun
        ({"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "3"}, None),
        ({"RANK": "4", "LOCAL_RANK": "0", "GROUP_RANK": "2", "SLURM_NODEID": "1"}, 1),  # torchrun under srun: SLURM's node
        ({"LOCAL_RANK": "0", "GROUP_RANK": "node-a"}, None),  # no number: no capture, and no crash
    ],
)
def test_each_nodes_first_rank_captures(environ: dict[str, str], node: int | None) -> None:
    assert node_of(environ) == node
