#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Three workers on two cores. A fresh clone's whole suite took 47.9 min of tests on the evening of 2026-12-03 (74deebe:
# 1,093 tests, 8,554 test-seconds; SLURM tasks end without the teardown, the CLI imports one command family, tests
# that trained one run twice share it), 54.3 earlier that day (ff45b84: 1,090 tests; legato's processes and the warm
# ranks end without the interpreter's teardown), 62.8 that morning (8dbd046: 1,079 tests,
# 11,218 test-seconds; the whole .ci/run, setup included, 7,471 CPU-s by a /proc sampler: a local job's ranks now fork
# from its one task, and run_trainer's launcher starts warm), 66.3 min the day before (7,747 CPU-s); 64.0 on 2026-12-02 (dec2974:
# 1,066 tests, 11,432 test-seconds; the one-node SLURM module 25.3 min on one worker, the multi-node one 8.0 on
# another), 61.1 min earlier that day (CPU-bound throughout),
# 69.1 min beside two busy CPU loops, 84.4 min on a slower VM (3e028a9; torch's import 2.8x slower; the cores 94% busy,
# 62% of their CPU in the suite's 1,674 cold-started Python processes, by BSD process accounting). The tests of each SLURM cluster run one after another on one worker, the one-node
# and the multi-node cluster's side by side on two: the one-node chain (31.5 min alone on 2026-12-02 before its runs were
# shortened) is the floor under the suite's time whatever the CPU savings elsewhere, half of it waiting on SLURM's
# minute-grained time limits. Earlier: 40.4 min with two workers (the
# cores 62% busy), 39.4 min with three; with four (2026-11-28) the cores stayed 99% busy through the first 40 minutes, so the suite is
# CPU-bound there and more workers buy nothing. Most of a rank's start is torch's import (1.4 s of CPU) and Dynamo's,
# which DDP and fully_shard import as they wrap a model (1.3 s): 2.6 of a median rank's 3.6 s of CPU. Ranks a test
# starts by script path fork warm from a server that paid it once (tests/helpers/warm.py), as `python -m legato`'s ranks fork from their launcher. tests/conftest.py keeps each SLURM module, and each
# module that builds a module fixture, on one worker, and orders the tests longest first; --no-loadscope-reorder keeps
# that order (xdist would otherwise hand out the groups with the most tests first, leaving the long single tests for
# the end).
exec .venv/bin/python -m pytest -q -n "${LEGATO_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder --durations=30 "$@"
