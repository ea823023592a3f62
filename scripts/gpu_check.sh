#!/usr/bin/env bash
# The CUDA checks of docs/gpu.md, for anyone with an NVIDIA GPU: bitwise resumes and named planted faults under
# `legato verify` (tests/e2e/test_cuda.py), the environment capture, and the checkpoint benchmark with the state on
# the GPU. Everything it prints also lands in OUT_DIR (default gpu-check/).
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# It uses the machine's own CUDA build of torch: $PYTHON (default python3) must import a torch that sees a GPU,
# and legato is installed (editable) into that Python's environment, so no torch is downloaded. Without network,
# put wheels of what is missing (submitit) in a folder and set PIP_FIND_LINKS to it.
# WORKERS (default 6) tests run at once on the one GPU; BENCH_MB (default "64 256 1024") sets the state sizes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "error: $PY has no torch that sees a CUDA device. Run this on a GPU machine, with PYTHON naming a Python whose torch is a CUDA build." >&2
    exit 2
fi
pip_args=(--quiet --no-build-isolation)
[ -n "${PIP_FIND_LINKS:-}" ] && pip_args+=(--no-index --find-links "$PIP_FIND_LINKS")
"$PY" -m pip install "${pip_args[@]}" -e . || exit 2
"$PY" -c 'import pytest, xdist' 2>/dev/null || "$PY" -m pip install "${pip_args[@]}" pytest pytest-xdist || exit 2
PYBIN=$PY

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PYBIN" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
    echo "CPUs: $(nproc)"
} 2>&1 | tee "$OUT/machine.txt"

status=0
"$PYBIN" -m pytest -v --durations=20 -p no:cacheprovider -n "${WORKERS:-6}" --dist load tests/e2e/test_cuda.py 2>&1 | tee "$OUT/tests.txt" || status=1
"$PYBIN" -m legato.orchestrator.cli repro capture "$OUT/capture" 2>&1 | tee "$OUT/capture.txt" || status=1
# shellcheck disable=SC2086  # BENCH_MB is a list of sizes
"$PYBIN" benchmarks/bench_checkpoint_async.py --device cuda --rounds "${BENCH_ROUNDS:-3}" --mb ${BENCH_MB:-64 256 1024} 2>&1 | tee "$OUT/bench_checkpoint.txt" || status=1
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED), output in $OUT/"
exit $status
