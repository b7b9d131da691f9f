#!/usr/bin/env bash
# Installs everything (scripts/install.sh), then runs the main job end to end on the embedded
# defaults: no servers, a SQLite file, the embedded models, results in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
mkdir -p out
semjobs run examples/prompts.jsonl -o out/results.jsonl --db sqlite:///out/semjobs.sqlite "$@"
echo "results: out/results.jsonl"
