#!/usr/bin/env bash
# Installs everything (scripts/install.sh) and runs the whole test suite. Needs Postgres on
# 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (see README); extra args go to pytest. The 25 slowest
# tests are listed at the end: what to look at when the suite nears its 30-minute budget.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
exec python -m pytest -q --durations=25 "$@"
