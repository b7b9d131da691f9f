#!/usr/bin/env bash
# Remakes requirements/cuda.lock, the exact versions of the GPU install (the Dockerfile installs
# with `-c requirements/cuda.lock`): pip resolves ".[vllm]" (vLLM pinned to the version the CPU
# build runs in every test) from PyPI alone, for this machine's Python and Linux x86_64, where
# PyPI's torch is its CUDA build. Nothing is installed (--dry-run --report); no pip
# configuration of this machine (its caps, its local CPU wheels) takes part.
#   bash scripts/lock_cuda.sh [OUT]        (OUT: default requirements/cuda.lock)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-requirements/cuda.lock}
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d -t semjobs-lock-cuda.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_NO_INDEX
"$PYTHON" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q -U pip
echo "lock_cuda.sh: resolving \".[vllm]\" from PyPI (metadata only) ..." >&2
"$tmp/venv/bin/pip" install -q --dry-run --ignore-installed --report "$tmp/report.json" ".[vllm]"
py=$("$tmp/venv/bin/python" -c 'import platform, sys; print(f"Python {platform.python_version()} on {sys.platform} {platform.machine()}")')
pipv=$("$tmp/venv/bin/pip" --version | cut -d' ' -f1-2)
{
    cat <<HEADER
# requirements/cuda.lock: the exact versions of the GPU install (vLLM's CUDA build and the torch
# it was built for). The Dockerfile installs \`-c requirements/cuda.lock ".[vllm]"\`; on a GPU
# box: \`pip install -c requirements/cuda.lock ".[vllm]"\`. Only vLLM's version is tested (its
# CPU build, requirements/cpu.lock); the rest is what pip resolved for it.
#
# GENERATED: do not edit by hand. Remake it with \`bash scripts/lock_cuda.sh\`;
# \`bash scripts/check_fresh.sh\` checks it still resolves.
# Made $(date -u +%Y-%m-%d) with $py, $pipv, from PyPI (pip, setuptools and wheel are not pinned).
HEADER
    "$tmp/venv/bin/python" - "$tmp/report.json" <<'PY'
import json
import sys

for item in sorted(json.load(open(sys.argv[1]))["install"], key=lambda i: i["metadata"]["name"].lower()):
    meta = item["metadata"]
    if meta["name"] not in ("semjobs", "pip", "setuptools", "wheel"):
        print(f"{meta['name']}=={meta['version']}")
PY
} >"$tmp/lock"
mv "$tmp/lock" "$OUT"
echo "lock_cuda.sh: wrote $OUT ($(grep -c '==' "$OUT") packages)" >&2
