"""Process entry for one rank started by the local launcher (identity from RANK, WORLD_SIZE, ...)."""

from __future__ import annotations

import sys

from legato.config import load_config
from legato.job import run_rank
from legato.launch import parse_args
from legato.rank_env import RankEnv


def main() -> int:
    args = parse_args(sys.argv[1:])
    return run_rank(load_config(args.config, args.overrides), RankEnv.from_environ())


if __name__ == "__main__":
    sys.exit(main())
