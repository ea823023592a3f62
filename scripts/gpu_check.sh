#!/usr/bin/env bash
# The CUDA checks of docs/gpu.md, for anyone with an NVIDIA GPU: bitwise resumes and named planted faults under
# `legato verify` (tests/e2e/test_cuda.py), the environment capture, and the benchmarks with the state on the GPU.
# Everything it prints also lands in OUT_DIR (default gpu-check/), one file per part.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# It uses the machine's own CUDA build of torch: $PYTHON (default python3) must import a torch that sees a GPU,
# and legato is installed (editable) into that Python's environment, so no torch is downloaded. Without network,
# put wheels of what is missing (submitit) in a folder and set PIP_FIND_LINKS to it.
#
# PARTS (default "tests capture defaults restore steps reduction async digest") picks the parts, in that order:
#   tests      tests/e2e/test_cuda.py, WORKERS (default 6) tests at once on the one GPU; their properties in tests.xml
#   capture    legato repro capture
#   defaults   benchmarks/bench_defaults.py: live Sessions at their defaults, BENCH_RANKS ranks (default "2 4") on the GPU
#   restore    benchmarks/bench_restore.py: a verified resume against torch.load, BENCH_RANKS ranks on the GPU, warm
#              (and cold, where this runs as root and may drop the page cache)
#   steps      benchmarks/bench_steps.py: per-step cost at the defaults, one rank over NCCL
#   reduction  benchmarks/bench_reduction.py: DDP's own bucket layout against the one a resume restores, NCCL
#   async      benchmarks/bench_checkpoint_async.py: what a checkpoint blocks, one rank
#   digest     benchmarks/bench_digest.py: the device rule's digest on the GPU against a copy and the host's XXH3
# BENCH_MB (default "64 256 1024") sets the state sizes, BENCH_ROUNDS (default 3) the rounds, and PART_TIMEOUT (seconds,
# default none) ends a part that runs longer, so that the parts after it still run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
PY=${PYTHON:-python3}
PARTS=" ${PARTS:-tests capture defaults restore steps reduction async digest} "
ROUNDS=${BENCH_ROUNDS:-3}
read -ra MB <<< "${BENCH_MB:-64 256 1024}"
read -ra RANKS <<< "${BENCH_RANKS:-2 4}"
CACHES=(warm)
[ -w /proc/sys/vm/drop_caches ] && CACHES=(warm cold)
mkdir -p "$OUT"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "error: $PY has no torch that sees a CUDA device. Run this on a GPU machine, with PYTHON naming a Python whose torch is a CUDA build." >&2
    exit 2
fi
pip_args=(--quiet --no-build-isolation)
[ -n "${PIP_FIND_LINKS:-}" ] && pip_args+=(--no-index --find-links "$PIP_FIND_LINKS")
"$PY" -m pip install "${pip_args[@]}" -e . || exit 2
"$PY" -c 'import pytest, xdist' 2>/dev/null || "$PY" -m pip install "${pip_args[@]}" pytest pytest-xdist || exit 2

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
    echo "CPUs: $(nproc)"
} 2>&1 | tee "$OUT/machine.txt"

status=0
# part NAME COMMAND...: run COMMAND when PARTS names NAME, its output shown and kept in OUT/NAME.txt.
part() {
    local name=$1
    shift
    [[ $PARTS == *" $name "* ]] || return 0
    echo "== $name: $*"
    local limit=()
    [ -n "${PART_TIMEOUT:-}" ] && limit=(timeout --signal=INT --kill-after=20 "$PART_TIMEOUT")
    local start=$SECONDS
    "${limit[@]}" "$@" 2>&1 | tee "$OUT/$name.txt" || { status=1; echo "== $name FAILED"; }
    echo "== $name took $((SECONDS - start)) s"
}

part tests "$PY" -m pytest -v --durations=20 -p no:cacheprovider -n "${WORKERS:-6}" --dist load -o junit_family=xunit1 --junitxml "$OUT/tests.xml" \
    tests/e2e/test_cuda.py
part capture "$PY" -m legato.orchestrator.cli repro capture "$OUT/capture"
part defaults "$PY" benchmarks/bench_defaults.py --device cuda --ranks "${RANKS[@]}" --mb "${MB[@]}" --rounds "$ROUNDS" --settle 0.5
part restore "$PY" benchmarks/bench_restore.py --device cuda --ranks "${RANKS[@]}" --mb "${MB[@]}" --rounds "$ROUNDS" --settle 0.5 \
    --cache "${CACHES[@]}"
part steps "$PY" benchmarks/bench_steps.py --device cuda --world 1 --batch 64 --workers 2 --steps 64 --rounds "$ROUNDS"
part reduction "$PY" benchmarks/bench_reduction.py --device cuda --world 1 --rounds "$((ROUNDS * 3))"
part async "$PY" benchmarks/bench_checkpoint_async.py --device cuda --rounds "$ROUNDS" --mb "${MB[@]}"
part digest "$PY" benchmarks/bench_digest.py --device cuda --rounds "$ROUNDS" --mb 256 1024 4096
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED), output in $OUT/"
exit $status
