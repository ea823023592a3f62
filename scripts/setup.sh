#!/usr/bin/env bash
# Creates .venv with legato and its test dependencies. torch is pinned first:
# a bare `torch` requirement with no torch installed pulls several GB of CUDA
# wheels, while 2.13.0 is the CPU build this machine kind provides.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${LEGATO_TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/pip install -q "$TORCH_SPEC"
fi
# strict: the editable install is a tree of links on sys.path, so a folder named legato/ beside a
# user's script (a run directory, say) cannot shadow the package as a namespace package. It links the
# files present now: run this again after adding a module.
.venv/bin/pip install -q -e '.[test]' --config-settings editable_mode=strict
# Bytecode for the editable tree, as pip compiles an installed package's: with PYTHONDONTWRITEBYTECODE set (as on
# this machine) every process would otherwise compile the ~115 modules a rank imports again, 0.17 s of CPU each.
.venv/bin/python - <<'PY'
import compileall, pathlib, sys, legato
sys.exit(0 if compileall.compile_dir(pathlib.Path(legato.__file__).parent, quiet=1) else 1)
PY
