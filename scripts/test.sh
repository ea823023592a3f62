#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Two workers: most end-to-end tests wait on processes, signals and the scheduler, not on the CPU
# (measured on 2 cores: 40.4 min with two workers; three were slower, over 42 min, from contention).
# conftest.py keeps each module, and all SLURM tests, on one worker.
exec .venv/bin/python -m pytest -q -n "${LEGATO_TEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@"
