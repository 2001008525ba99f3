#!/usr/bin/env bash
# Check the project on the oldest and the newest Python that `requires-python` declares (with
# --every, on each one) where this machine has it: a venv per version (.venv-py3XX, rebuilt only
# when pyproject.toml changes, like .venv) and the fast unit tests in it, which include building
# the wheel and importing every product module from it. The version .venv runs is skipped:
# infra/test.sh runs the whole suite there. A change that works on both ends of the range and
# breaks only a version between them is rare; each version checked costs the suite beside it
# about 200 s of CPU (a venv and the unit tests), a tenth of CI's two cores.
set -euo pipefail
cd "$(dirname "$0")/.."

# Keep in step with requires-python in pyproject.toml (tests/integration/operations/test_wheel.py
# checks it).
VERSIONS=(3.11 3.12 3.13)

find_python() {
  # `python3.X` on PATH if it runs (a pyenv shim may not), else a pyenv build of that version.
  local version=$1 candidate
  for candidate in "$(command -v "python$version" || true)" \
    "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/"python$version"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c "" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

main_version="$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
checked=("${VERSIONS[0]}" "${VERSIONS[-1]}")
[ "${1:-}" != "--every" ] || checked=("${VERSIONS[@]}")
stamp_name=".installed-$(sha256sum pyproject.toml | cut -c1-16)"

check_version() {
  local version=$1 python=$2 venv=".venv-py${1/./}" started=$SECONDS installed
  if [ ! -f "$venv/$stamp_name" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # No .pyc at install time: compiling every module of pyspark and the rest took 2/3 of the
    # install (200 s against 80 s on 3.13 here). The test run below caches what it imports.
    "$venv/bin/python" -m pip install --quiet --no-compile -e ".[dev]"
    touch "$venv/$stamp_name"
  fi
  installed=$SECONDS
  # The unit tests: every test that starts neither the broker nor Spark (tests/conftest.py marks
  # the others integration), i.e. tests/unit/ and the few in tests/integration/ that need neither
  # (the wheel, the docs' skip reasons, what the cluster run ships, the lake without Spark).
  # Bytecode of what the tests import is kept inside the venv even where the environment says
  # PYTHONDONTWRITEBYTECODE: without it every run compiles pyspark and pandas again (2-3 s a
  # process).
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PWD/$venv/pycache" \
    SPARK_LOCAL_IP=127.0.0.1 "$venv/bin/python" -m pytest -q -m "not integration"
  echo "python $version ($python): install $((installed - started)) s," \
    "unit tests $((SECONDS - installed)) s"
}

# The versions run side by side (each pytest uses one core), each into its own log, shown in
# order once all are done.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
declare -A runs=()
for version in "${VERSIONS[@]}"; do
  if [ "$version" = "$main_version" ]; then
    echo "python $version: .venv, the full suite"
    continue
  fi
  if [[ " ${checked[*]} " != *" $version "* ]]; then
    echo "python $version: between the oldest and the newest, skipped (--every checks it)"
    continue
  fi
  python="$(find_python "$version")"
  if [ -z "$python" ]; then
    echo "python $version: not on this machine, skipped"
    continue
  fi
  check_version "$version" "$python" >"$logs/$version.log" 2>&1 &
  runs[$version]=$!
done
failed=()
for version in "${VERSIONS[@]}"; do
  [ -n "${runs[$version]:-}" ] || continue
  wait "${runs[$version]}" || failed+=("$version")
  cat "$logs/$version.log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "unit tests failed on python ${failed[*]}" >&2
  exit 1
fi
