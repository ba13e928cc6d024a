#!/usr/bin/env bash
# Measure the hot path's metrics overhead: the benchmark's events workload against gunicorn
# (README.md's command, multiprocess metrics) with WORLDCELL_METRICS=true vs false, alternating.
#   scripts/bench-metrics-overhead.sh [rounds=3]   (env: BENCH_PORT, BENCH_DB, BENCH_PY=path to bench.py)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
PORT=${BENCH_PORT:-18430}
DB=${BENCH_DB:-wc_ops_bench}
BENCH=${BENCH_PY:-contrib/bench-micro/bench.py}
OUT=${OUT:-bench-results/metrics-overhead}
mkdir -p "$OUT"
export DATABASE_URL=postgres://postgres@127.0.0.1:5432/$DB WORLD_SECRET=bench-secret WORLDCELL_USE_CELERY=true
export WORLDCELL_DATA_DIR=${WORLDCELL_DATA_DIR:-$PWD/data/bench-metrics} WORLDCELL_NO_BOOTSTRAP=1
export CELERY_BROKER_URL=${CELERY_BROKER_URL:-redis://127.0.0.1:6379/13}
psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1 || psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE \"$DB\""
.venv/bin/python manage.py migrate --noinput -v 0
for round in $(seq 1 "$ROUNDS"); do
  for mode in true false; do
    export WORLDCELL_METRICS=$mode PROMETHEUS_MULTIPROC_DIR=$WORLDCELL_DATA_DIR/prom
    .venv/bin/gunicorn -c python:worldcell.gunicorn_conf worldcell.wsgi:application --bind 127.0.0.1:$PORT \
      --workers 3 --threads 8 --error-logfile "$OUT/api.log" & pid=$!
    for _ in $(seq 1 100); do curl -sf http://127.0.0.1:$PORT/v1/health >/dev/null && break; sleep 0.1; done
    echo "round $round metrics=$mode load: $(uptime | sed 's/.*load average: //')"
    python3 "$BENCH" --url http://127.0.0.1:$PORT --secret bench-secret --workload events \
      --server-pid $pid --server-tree --json "$OUT/events-$mode-$round.json" >"$OUT/events-$mode-$round.txt" 2>&1 || true
    kill $pid; wait $pid 2>/dev/null || true
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, pathlib, statistics, sys
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for mode in ("true", "false"):
    for r in range(1, rounds + 1):
        doc = json.loads((out / f"events-{mode}-{r}.json").read_text())
        ev = doc["runs"]["events"][0]
        rows.setdefault(mode, []).append((ev["applyEventPerS"], ev["applyEventLatencyMs"]["p50"],
                                          ev["cpu"].get("serverCpuS"), ev["rpcs"], ev["ok"]))
for mode, vals in rows.items():
    print(f"metrics={mode}: applyEvent/s {[v[0] for v in vals]} p50 ms {[v[1] for v in vals]} "
          f"server CPU s {[v[2] for v in vals]} ok {[v[4] for v in vals]}")
on = statistics.median(v[0] for v in rows["true"]); off = statistics.median(v[0] for v in rows["false"])
con = statistics.median(v[2] / v[3] * 1e6 for v in rows["true"]); coff = statistics.median(v[2] / v[3] * 1e6 for v in rows["false"])
print(f"median applyEvent/s: on {on:.0f}, off {off:.0f} -> throughput cost {100 * (off - on) / off:+.1f}%")
print(f"median server CPU per RPC: on {con:.0f} us, off {coff:.0f} us -> CPU cost {100 * (con - coff) / coff:+.1f}%")
PY
