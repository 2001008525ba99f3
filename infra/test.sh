#!/usr/bin/env bash
# README command 2: set up, then lint, type-check, run the unit tests on every other supported
# Python (infra/check_pythons.sh) and every test here (real broker, Spark, Delta).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# A selected run (arguments for pytest) checks this Python only.
if [ $# -eq 0 ]; then
  bash infra/check_pythons.sh
fi
exec .venv/bin/python -m pytest "$@"
