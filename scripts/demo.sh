#!/usr/bin/env bash
# Sets up .venv and runs the main job: `legato run configs/tiny_gpt.yaml` on
# submitit's local executor, 2 ranks (gloo on CPU). The config's demo chaos
# sends a real SIGUSR2 to rank 1 twice; each time every rank stops after the
# same step, writes one barrier checkpoint, rank 0 requeues the job, and the
# next attempt resumes with its state hash verified. Extra arguments go to
# `legato run` (for example --set chaos.preempt_every_s=5).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PYTHONWARNINGS=ignore
RUN_DIR=${RUN_DIR:-runs/demo}
rm -rf "$RUN_DIR"
exec .venv/bin/legato run configs/tiny_gpt.yaml --set run.dir="$RUN_DIR" "$@"
