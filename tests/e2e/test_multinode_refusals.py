"""Multi-node refusals through the real CLI, no cluster: a stop signal that could come during start-up, and a
multi-node devcluster of fewer than two nodes (the rules themselves: unit/test_multinode_units.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.cli import assert_usage_error, legato


@pytest.mark.parametrize(
    "sets, needles",
    [
        (
            ["slurm.time_min=1", "slurm.signal_lead_s=30"],
            ("slurm.time_min is 1", "slurm.signal_lead_s is 30", "leaves 0s", "Raise slurm.time_min to 2"),
        ),
        (["slurm.time_min=2", "slurm.signal_lead_s=90"], ("leaves 0s", "Raise slurm.time_min to 3", "lower slurm.signal_lead_s to 30")),
        (
            ["slurm.time_min=60", "slurm.signal_lead_s=3520"],
            ("slurm.signal_lead_s is 3520", "leaves 50s", "Raise slurm.time_min to 61", "lower slurm.signal_lead_s to 3510"),
        ),
    ],
)
def test_a_stop_signal_that_could_come_during_start_up_is_refused(tmp_path: Path, sets: list[str], needles: tuple[str, ...]) -> None:
    run_dir = tmp_path / "run"
    args = ["run", str(ROOT / "configs" / "tiny_gpt_slurm.yaml"), "--set", f"run.dir={run_dir}"]
    for item in sets:
        args += ["--set", item]
    assert_usage_error(legato(*args), *needles)
    assert not run_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal comes after the root check")
def test_devcluster_nodes_needs_a_count_of_two_or_more() -> None:
    assert_usage_error(legato("devcluster", "up", "--nodes", "1"), "--nodes 1", "omit --nodes for the one-node cluster")
    assert_usage_error(legato("devcluster", "up", "--nodes"), "needs a node count")
