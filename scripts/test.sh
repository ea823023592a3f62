#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Three workers on two cores: most end-to-end tests wait on processes, signals and the scheduler, not on
# the CPU. Measured from fresh clones on 2 cores: 40.4 min of tests with two workers (the cores 62% busy),
# 39.4 min with three. tests/conftest.py keeps the SLURM tests, and each module that builds a module fixture, on
# one worker, and orders the tests longest first; --no-loadscope-reorder keeps that order (xdist would otherwise
# hand out the groups with the most tests first, leaving the long single tests for the end).
exec .venv/bin/python -m pytest -q -n "${LEGATO_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder --durations=30 "$@"
