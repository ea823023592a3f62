"""`legato devcluster up`'s timing flags reach the cluster's Settings, each flag its own field, with Settings' defaults
(parsed in-process; the real cluster these settings start is tests/cluster's)."""

from __future__ import annotations

from legato.orchestrator.arguments import build_parser
from legato.orchestrator.commands.tooling import _settings
from legato.slurm.slurmconf import Settings


def test_the_flags_default_to_the_clusters_settings() -> None:
    args = build_parser().parse_args(["devcluster", "up"])
    assert _settings(args, accounting=True) == Settings()


def test_each_flag_sets_its_own_field() -> None:
    args = build_parser().parse_args(
        ["devcluster", "up", "--cred-expire", "11", "--sched-interval", "12", "--kill-wait", "13", "--preempt-grace", "14"]
    )
    assert _settings(args, accounting=False) == Settings(
        cred_expire_s=11, sched_interval_s=12, kill_wait_s=13, preempt_grace_s=14, accounting=False
    )
