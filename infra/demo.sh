#!/usr/bin/env bash
# README command 1: set up, start a local broker and lake, produce sample tenants, run the stream
# until it has caught up, print a per-tenant summary, stop what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh --archive-in-background
exec .venv/bin/tenant-windows demo "$@"
