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
# Real clients from Debian: the query console's test drives Chromium headless
# (tests/integration/query/test_query_api.py), and a real Prometheus scrapes the stream and the
# query service and loads the alert rules (tests/integration/query/test_prometheus_scrape.py;
# promtool comes with it).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] \
  || [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >/dev/null \
      && apt-get install -y -q chromium chromium-driver prometheus >/dev/null
  else
    echo "the tests need Debian's chromium, chromium-driver and prometheus:" \
      "sudo apt-get install -y chromium chromium-driver prometheus" >&2
    exit 1
  fi
fi
# A selected run (arguments for pytest) checks this Python only.
if [ $# -eq 0 ]; then
  bash infra/check_pythons.sh
fi
exec .venv/bin/python -m pytest "$@"
