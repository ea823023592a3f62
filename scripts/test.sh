#!/usr/bin/env bash
# Sets up .venv (see setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
