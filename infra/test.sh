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
# The query console's test drives Debian's Chromium headless (tests/test_query_api.py).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null
  else
    echo "the tests need Debian's chromium and chromium-driver:" \
      "sudo apt-get install -y chromium chromium-driver" >&2
    exit 1
  fi
fi
# A selected run (arguments for pytest) checks this Python only.
if [ $# -eq 0 ]; then
  bash infra/check_pythons.sh
fi
exec .venv/bin/python -m pytest "$@"
