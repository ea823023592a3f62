"""Process entry for one rank started by the local launcher (identity from RANK, WORLD_SIZE, ...)."""

from __future__ import annotations

import sys

from legato.config import load_config
from legato.errors import EXIT_USAGE, UsageError
from legato.runtime.job import run_rank
from legato.runtime.launch_args import parse_args
from legato.runtime.rank_env import RankEnv
from legato.system.exiting import finish
from legato.system.lifeline import die_with_launcher


def main() -> int:
    """Run this rank from the command line and the environment; the exit code (EXIT_USAGE for a bad config)."""
    die_with_launcher()
    args = parse_args(sys.argv[1:])
    try:
        cfg = load_config(args.config, args.overrides)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    return run_rank(cfg, RankEnv.from_environ())


if __name__ == "__main__":
    finish(main)
