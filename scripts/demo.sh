#!/usr/bin/env bash
# Sets up .venv and runs the main job: tiny GPT on 2 local ranks (gloo on CPU).
# A real SIGUSR2 reaches rank 1 twice; every rank stops after the same step,
# writes one barrier checkpoint, exits 75, and `legato train` resumes it with
# the restored state hash verified. Extra arguments go to `legato train`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PYTHONWARNINGS=ignore
RUN_DIR=${RUN_DIR:-runs/demo}
rm -rf "$RUN_DIR"
exec .venv/bin/legato train configs/tiny_gpt.yaml --set run.dir="$RUN_DIR" \
    --set chaos.signal_rank=1 --set "chaos.signal_at_steps=[20,40]" "$@"
