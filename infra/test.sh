#!/usr/bin/env bash
# README command 2: set up, then lint, type-check, run the unit tests on the oldest and newest
# supported Python (infra/check_pythons.sh) and every test here (real broker, Spark, Delta).
#
#   infra/test.sh                      everything, the suite on TEST_WORKERS workers (4)
#   infra/test.sh -m "not integration" the fast loop: unit tests only, about a minute
#   infra/test.sh tests/unit/streaming a folder, a file or a test: pytest's own arguments
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
# A selected run (arguments for pytest) checks this Python only. The other Pythons' venvs and
# unit tests (about 90 CPU s) run beside the lint and the suite, which keeps both cores busy
# from its second minute: they cost the suite that CPU wherever they run, and run early, so
# they are done long before its last tests. `nice` alone does not make them yield: where the
# kernel groups each session's processes (sched_autogroup), a session competes as a whole, at
# its group's priority, so this session takes an equal share of the CPU until it ends.
pythons_log=""
if [ $# -eq 0 ]; then
  pythons_log="$(mktemp)"
  # In a session of its own, so a failed lint (set -e) ends it and its children. The type check
  # runs there too, first: its 10-15 s need not hold up the suite's start.
  setsid nice -n 10 bash -c '.venv/bin/mypy && bash infra/check_pythons.sh' >"$pythons_log" 2>&1 &
  pythons_pid=$!
  trap 'kill -- -"$pythons_pid" 2>/dev/null || kill "$pythons_pid" 2>/dev/null || true; rm -f "$pythons_log"' EXIT
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
[ $# -eq 0 ] || .venv/bin/mypy
# Real clients from Debian: the query console's test drives Chromium headless
# (tests/integration/query/test_query_api.py), and a real Prometheus scrapes the stream and the
# query service and loads the alert rules (tests/integration/query/test_prometheus_scrape.py;
# promtool comes with it); psql connects through the Postgres door
# (tests/integration/query/test_pg_door.py).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] \
  || [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ] || [ ! -x /usr/bin/psql ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >/dev/null \
      && apt-get install -y -q chromium chromium-driver prometheus postgresql-client >/dev/null
  else
    echo "the tests need Debian's chromium, chromium-driver, prometheus and postgresql-client:" \
      "sudo apt-get install -y chromium chromium-driver prometheus postgresql-client" >&2
    exit 1
  fi
fi
if [ $# -eq 0 ]; then
  # Tests sharing a module-scoped fixture stay together (tests/conftest.py); the rest spread.
  # Four workers on two cores: much of an integration test is waiting (for a broker, a batch, a
  # process to end). One CI each: 18:05 on four workers (one other Python checked beside them)
  # against 19:23 on three (two other Pythons).
  set -- -n "${TEST_WORKERS:-4}" --dist loadgroup
fi
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ -n "$pythons_log" ]; then
  wait "$pythons_pid" || status=1
  cat "$pythons_log"
fi
exit "$status"
