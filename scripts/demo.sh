#!/usr/bin/env bash
# Installs everything (scripts/install.sh), then runs the main job end to end on the embedded
# defaults: no servers, a SQLite file, the embedded models, results in out/. The same questions
# then go through token-level speculation (token_sd) and SemanticSpec (semspec), and one line
# each compares them with the first run (semjobs compare): what semjobs is for, whatever the
# small embedded pair makes of it. Extra arguments go to every run.
#
# One question at a time per engine process (--batch-size 1): on a CPU speculation pays only
# for a sequence decoding alone, so semspec pauses drafting beside others (docs/batching.md)
# and would show nothing drafted; pass --batch-size 8 to see the batched throughput instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
mkdir -p out
DB=sqlite:///out/semjobs.sqlite
# semjobs run prints its job's id last on stdout (its progress goes to stderr)
jobs=()
for method in ar token_sd semspec; do
    out=out/$([ "$method" = ar ] && echo results || echo "$method").jsonl
    jobs+=("$(semjobs run examples/prompts.jsonl -o "$out" --force --db "$DB" --batch-size 1 "$@" --method "$method" | tail -n 1)")
    echo "results: $out"
done
semjobs compare "${jobs[@]}" --db "$DB"
