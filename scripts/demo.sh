#!/usr/bin/env bash
# Installs everything (scripts/install.sh), then runs the main job end to end on the embedded
# defaults: no servers, a SQLite file, the embedded models, results in out/. The same questions
# then go through SemanticSpec, and one line compares the two (semjobs compare): what semjobs
# is for, whatever the small embedded pair makes of it. Extra arguments go to both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
mkdir -p out
DB=sqlite:///out/semjobs.sqlite
# semjobs run prints its job's id last on stdout (its progress goes to stderr)
first=$(semjobs run examples/prompts.jsonl -o out/results.jsonl --db "$DB" "$@" | tail -n 1)
echo "results: out/results.jsonl"
second=$(semjobs run examples/prompts.jsonl -o out/semspec.jsonl --db "$DB" "$@" --method semspec | tail -n 1)
echo "results: out/semspec.jsonl"
semjobs compare "$first" "$second" --db "$DB"
