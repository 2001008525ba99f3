#!/usr/bin/env bash
# README command 2: set up, then lint, type-check and run every test (real broker, Spark, Delta).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
