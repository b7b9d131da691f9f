# The worker measurement of docs/batching.md ("One engine process per core"): one job of 64
# questions through `semjobs worker --processes 1`, then through `--processes 2`, each worker
# ready before the job is submitted. Needs Postgres and Redis as in the README; run from here.
set -e
cd "$(dirname "$0")"
export SEMJOBS_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/semjobs_wbench
export SEMJOBS_REDIS_URL=redis://127.0.0.1:6379/9
export SEMJOBS_QUEUE=wbench
export SEMJOBS_LAST_RUN_FILE=$PWD/last_run.json
SJ=semjobs
dropdb -h 127.0.0.1 -U postgres --if-exists semjobs_wbench; createdb -h 127.0.0.1 -U postgres semjobs_wbench
$SJ db upgrade
for P in 1 2; do
  $SJ worker --processes $P -n wb$P > wb$P.log 2>&1 &
  W=$!
  until [ "$(grep -c ' ready.' wb$P.log)" -ge "$P" ]; do sleep 1; done
  JOB=$($SJ submit ../gsm8k_101_164.jsonl --max-new-tokens 128 | tail -1)
  until $SJ status $JOB --json | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin)['status']=='completed' else 1)"; do sleep 2; done
  $SJ status $JOB --json > wb$P.status.json
  kill -TERM $W; wait $W || true
done
