#!/usr/bin/env bash
# Installs everything (scripts/install.sh) and runs the whole test suite. Needs Postgres on
# 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (see README); extra args go to pytest (`-n 0`: one
# process). The 25 slowest tests are listed at the end: what to look at when the suite nears its
# 30-minute budget.
#
# One pytest process per core, at most 4 (pytest-xdist): the tests decode with one thread
# (tests/semspec/conftest.py; the workers they start, SEMJOBS_THREADS) or wait on processes
# they start, so one process leaves a 2-core machine's other core idle most of the time; each
# test has its own database, queue and temporary directory (tests/conftest.py). A file's tests
# run in one process (--dist loadfile): the models and engines its fixtures load, load once;
# files are handed out in the order tests/conftest.py collects them (slow files first), not
# by their number of tests (--no-loadscope-reorder).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
exec python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
