#!/usr/bin/env bash
# Early warning for the next upstream release: does semjobs still work with the NEWEST versions
# pyproject.toml's ranges allow (not requirements/cpu.lock's)? In a throw-away virtualenv and
# an empty HOME (both in one mktemp dir) it
#   1. installs as scripts/install.sh does, without the lock (INSTALL_LOCK=none),
#   2. runs README command 1 as scripts/demo.sh does (`semjobs run examples/prompts.jsonl
#      --batch-size 1` with ar, token_sd and semspec, then `semjobs compare`; outputs in the temp
#      dir) and checks every item came out of every run,
#   3. runs the tests that load the real embedded models: `pytest -m real_model` (they need
#      Postgres on 127.0.0.1:5432 and Redis on 127.0.0.1:6379; a missing one fails),
#   4. checks that requirements/cuda.lock (the GPU install) still resolves on PyPI,
# then prints the versions that differ from the lock (package lock -> newest) and PASS/FAIL with
# the time of each stage, after the tail of each failed stage's log. Exits 1 when a stage failed.
# Run it before every stop; when it passes with new versions, `bash scripts/lock.sh` takes them.
#   bash scripts/check_fresh.sh [--keep] [--tail N] [-- PYTEST_ARGS...]
#     --keep     keep the temp dir (venv, HOME, outputs, logs/); removed otherwise
#     --tail N   lines of a failed stage's log to print (default 40)
# pip's download cache stays the caller's (it holds files, not choices of version).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOCK="$REPO/requirements/cpu.lock"
KEEP=0
TAIL=40
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) KEEP=1 ;;
        --tail) TAIL=${2:?--tail needs a number}; shift ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "check_fresh.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

T0=$(date +%s)
tmp=$(mktemp -d -t semjobs-fresh.XXXXXX)
mkdir -p "$tmp/home" "$tmp/logs" "$tmp/out"
cleanup() {
    if [ "$KEEP" = 1 ]; then echo "check_fresh: kept $tmp (venv/, home/, out/, logs/)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh machine: an empty HOME (semjobs' model cache and last-run file, torch's and HF's
# caches live under it) and none of the caller's semjobs settings; the tests' service
# locations (SEMJOBS_TEST_*) are kept.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pip}"
# the interpreter itself, found before HOME changes (pyenv's shims read it)
export PYTHON=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
export HOME="$tmp/home"
unset XDG_CACHE_HOME XDG_CONFIG_HOME XDG_DATA_HOME HF_HOME HF_HUB_CACHE HUGGINGFACE_HUB_CACHE \
    TRANSFORMERS_CACHE HF_DATASETS_CACHE TORCH_HOME VIRTUAL_ENV PYTHONPATH
for v in $(compgen -e | grep '^SEMJOBS_' | grep -v '^SEMJOBS_TEST_'); do unset "$v"; done
export PATH="$tmp/venv/bin:$PATH"
cd "$REPO" || exit 1
echo "check_fresh: working in $tmp ($([ "$KEEP" = 1 ] && echo kept || echo removed) at the end)"

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
NAMES=() RESULTS=() TIMES=() NOTES=() FAILED_LOGS=()
# stage NAME LOG COMMAND...: runs COMMAND with its output in LOG, records PASS/FAIL and time.
stage() {
    local name=$1 log=$2 start rc
    shift 2
    echo "check_fresh: $name ... (log: $log)"
    start=$(date +%s)
    "$@" >"$log" 2>&1
    rc=$?
    NAMES+=("$name") TIMES+=("$(fmt $(($(date +%s) - start)))")
    if [ $rc = 0 ]; then RESULTS+=(PASS); else RESULTS+=(FAIL); FAILED_LOGS+=("$name|$log"); fi
    NOTES+=("")
    return $rc
}
skip() { NAMES+=("$1") RESULTS+=(SKIP) TIMES+=("-") NOTES+=("(install failed)"); }

fresh_install() { INSTALL_VENV="$tmp/venv" INSTALL_LOCK=none bash scripts/install.sh; }

readme_run() {
    local db="sqlite:///$tmp/out/semjobs.sqlite" method jobs=()
    for method in ar token_sd semspec; do
        jobs+=("$(semjobs run examples/prompts.jsonl -o "$tmp/out/$method.jsonl" --db "$db" --batch-size 1 \
                  --method "$method" | tail -n 1)") || return
        all_results "$tmp/out/$method" || return
    done
    semjobs compare "${jobs[@]}" --db "$db"
}

# every input of examples/prompts.jsonl has a result in OUT.jsonl, and nothing failed
all_results() {
    local out="$1.jsonl" want got
    want=$(grep -c . examples/prompts.jsonl)
    got=0
    [ -f "$out" ] && got=$(grep -c . "$out")
    if [ -f "$1.jsonl.errors.jsonl" ]; then
        echo "check_fresh: items failed ($1.jsonl.errors.jsonl):"; head -c 3000 "$1.jsonl.errors.jsonl"
        return 1
    fi
    [ "$got" = "$want" ] || { echo "check_fresh: $got of $want results in $out"; return 1; }
    echo "check_fresh: $got of $want results in $out"
}

real_model_tests() {
    SEMJOBS_TEST_REQUIRE_SERVICES=1 python -m pytest -m real_model -q -rfE --tb=short -p no:cacheprovider \
        --basetemp="$tmp/pytest" "${PYTEST_ARGS[@]}"
}

# the versions of the fresh venv that differ from the lock: "package lock -> newest"
diff_lock() {
    pip freeze --exclude-editable >"$tmp/logs/freeze.txt" 2>/dev/null || return
    python - "$LOCK" "$tmp/logs/freeze.txt" <<'EOF'
import re, sys

def read(path):
    pins = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (s.strip() for s in line.split("==", 1))
            pins[re.sub(r"[-_.]+", "-", name).lower()] = (name, version)
    return pins

lock, fresh = read(sys.argv[1]), read(sys.argv[2])
rows = []
for key in sorted(lock.keys() | fresh.keys()):
    old, new = lock.get(key), fresh.get(key)
    if old is None:
        rows.append(f"{new[0]} (not in the lock) -> {new[1]}")
    elif new is None:
        rows.append(f"{old[0]} {old[1]} -> (not installed)")
    elif old[1] != new[1]:
        rows.append(f"{new[0]} {old[1]} -> {new[1]}")
print(f"versions that differ from requirements/cpu.lock: {len(rows) or 'none'}")
for r in rows:
    print(f"    {r}")
EOF
}

# the GPU install's lock still resolves on PyPI (metadata only; no pip configuration of this
# machine: its caps and local CPU wheels are not what a GPU box sees)
cuda_lock_resolves() {
    (cd "$REPO" && env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
        "$tmp/venv/bin/pip" install --dry-run --ignore-installed -c requirements/cuda.lock ".[vllm]")
}

if stage "install (newest versions)" "$tmp/logs/install.log" fresh_install; then
    stage "requirements/cuda.lock resolves" "$tmp/logs/cuda_lock.log" cuda_lock_resolves
    DIFF=$(diff_lock) || DIFF="versions: could not compare with the lock"
    stage "README command 1 (semjobs run)" "$tmp/logs/run.log" readme_run
    stage "pytest -m real_model" "$tmp/logs/tests.log" real_model_tests
    counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$tmp/logs/tests.log" |
             tail -1 | sed -E 's/=//g; s/, [0-9]+ deselected//; s/ in [0-9.]+s.*//; s/^ *//')
    [ -z "$counts" ] || NOTES[${#NOTES[@]} - 1]="($counts)"
else
    DIFF="versions: not compared (install failed)"
    skip "requirements/cuda.lock resolves"
    skip "README command 1 (semjobs run)"
    skip "pytest -m real_model"
fi

for entry in "${FAILED_LOGS[@]}"; do
    echo
    echo "----- ${entry%%|*} FAILED: last $TAIL lines of its log -----"
    tail -n "$TAIL" "${entry#*|}"
done

echo
echo "===== check_fresh summary ($(fmt $(($(date +%s) - T0))) in all) ====="
echo "$DIFF"
status=0
for i in "${!NAMES[@]}"; do
    printf '  %-4s %7s  %s%s\n' "${RESULTS[$i]}" "${TIMES[$i]}" "${NAMES[$i]}" "${NOTES[$i]:+ ${NOTES[$i]}}"
    [ "${RESULTS[$i]}" = PASS ] || status=1
done
if [ $status = 0 ]; then
    echo "check_fresh: PASS: the newest versions work; \`bash scripts/lock.sh\` locks them"
else
    echo "check_fresh: FAIL: a stage failed on the newest versions the ranges allow (log tails above;" \
         "requirements/cpu.lock still installs the tested ones)"
fi
exit $status
