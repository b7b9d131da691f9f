#!/usr/bin/env bash
# Installs everything (scripts/install.sh) and runs the whole test suite. Needs Postgres on
# 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (see README); extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
