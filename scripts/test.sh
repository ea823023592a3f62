#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Three workers on two cores: the suite is CPU-bound there (the cores stay busy throughout; four workers bought nothing
# on 2026-11-28), so its time is its CPU. A fresh clone's tests took 20.1 min on 2026-12-05, morning (1,160 tests;
# 27.4 beside two busy CPU loops; 28.7 under the recorders of scripts/suite_cpu.py on 2026-12-04); where
# their 3,070 CPU-s go, by
# process kind, and how to measure it again: docs/benchmarks.md,
# "Where does the test suite's CPU go?"; earlier runs: docs/benchmarks-log.md. Most of a rank's start is torch's
# import (1.5 s of CPU) and what DDP and fully_shard import as they wrap a model (1.3 s). Ranks a test starts by script
# path fork warm from a server that paid it once (tests/helpers/warm.py), as `python -m legato`'s ranks fork from their
# launcher. tests/conftest.py keeps each SLURM module, and each module that builds a module fixture, on one worker, and
# orders the tests longest first: the one-node SLURM chain (17 min, half of it waiting on SLURM's minute-grained time
# limits) starts first so that it never ends last. --no-loadscope-reorder keeps that
# order (xdist would otherwise hand out the groups with the most tests first, leaving the long single tests for the end).
exec .venv/bin/python -m pytest -q -n "${LEGATO_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder --durations=30 "$@"
