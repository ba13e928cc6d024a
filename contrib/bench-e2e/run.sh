#!/usr/bin/env bash
# End-to-end benchmark: the same Nitro app (workflow 4.6.0, a 5-step workflow) on a World picked
# at run time. See docs/benchmarks.md.
#
#   contrib/bench-e2e/run.sh <world-celld-0.1.0.tgz> [--world W] [--runs 200] [--inflight 20]
#       [--warmup 20] [--json FILE] [--fleet-only]
#
#   W = worldcell-pg      this checkout as the README's production section starts it:
#                         PostgreSQL + waitress + Celery worker + beat
#       worldcell-pg-gunicorn  the same with gunicorn (gthread 3x8) as the API server
#       worldcell-sqlite  this checkout: manage.py devfleet on SQLite
#       world-postgres    @workflow/world-postgres 4.3.0 (graphile worker inside the app)
#       world-local       @workflow/world-local (files, in-process queue)
#       reference         world-celld's in-memory reference fleet (its testing entry)
#
# --fleet-only (worldcell-pg, worldcell-pg-gunicorn, worldcell-sqlite, reference): start the fleet
# only, print one line "fleet ready: URL SECRET PIDS" and keep it running until Ctrl-C / SIGTERM
# (for bench.py: --url URL --secret SECRET --server-pid PIDS --server-tree).
# Every World gets fresh state: a new PostgreSQL cluster (initdb, default settings, durable
# commits) on a private port for worldcell-pg and world-postgres, a new data directory otherwise.
# Everything listens on 127.0.0.1 only. Environment:
#   BENCH_WORK       scratch directory (app install, clusters, logs); default /tmp/worldcell-bench-e2e
#   BENCH_PORT_BASE  first port of a block of 40; default 18800 (app +1, fleet +10, PostgreSQL +32)
#   BENCH_REDIS_URL  Celery broker for worldcell-pg; default: a private redis-server started on
#                    port base + 33 (so no other Celery app shares the broker; its CPU is counted)
#   BENCH_KEEP=1     keep the PostgreSQL cluster's data directory after the run (logs are kept)
#   BENCH_PG_LOG=1   analysis, not a measurement: PostgreSQL logs every statement (log_statement=all)
#                    with its client's role (worldcell-pg: api / worker / beat as application_name)
#                    to $RUN_DIR/pg/postgres.log; count them with contrib/bench-e2e/pg_log_counts.py
#   BENCH_PG_STATS=1 analysis: pg_stat_statements (with planning time) in the private cluster; after
#                    the run its top statements by time are written to $RUN_DIR/pg_stat_statements.txt
#   BENCH_WAITRESS_THREADS  analysis: waitress's --threads for worldcell-pg (default 8, the README's)
#   BENCH_API_CPUS   run the API process (waitress, gunicorn or devfleet) under `taskset -c <list>`,
#                    e.g. 1 (docs/operations.md "One core per process"); default: unpinned
#                    (devfleet pins itself to one core anyway: its --cpu)
#   BENCH_WORKER_CPUS  the same for the Celery worker
#   BENCH_PYTHON     Python with this checkout installed; default <checkout>/.venv/bin/python,
#                    created with `pip install -e .` when missing
# Output: the driver's table on stdout, its JSON in --json (default
# <checkout>/bench-results/e2e-<world>-<utc time>.json). Exit status: the driver's (0 = all runs
# completed, 1 = some failed, 2 = setup error).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
TARBALL=$(realpath "$1"); shift
[[ -f $TARBALL ]] || { echo "no such tarball: $TARBALL" >&2; exit 2; }

WORLD=worldcell-pg RUNS=200 INFLIGHT=20 WARMUP=20 JSON="" FLEET_ONLY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --world) WORLD=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --inflight) INFLIGHT=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --fleet-only) FLEET_ONLY=1; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
case $WORLD in
  worldcell-pg|worldcell-pg-gunicorn|worldcell-sqlite|world-postgres|world-local|reference) ;;
  *) echo "unknown --world $WORLD" >&2; usage ;;
esac

WORK=${BENCH_WORK:-/tmp/worldcell-bench-e2e}
API_PIN=(); [[ -z ${BENCH_API_CPUS:-} ]] || API_PIN=(taskset -c "$BENCH_API_CPUS")  # taskset execs: same pid
WORKER_PIN=(); [[ -z ${BENCH_WORKER_CPUS:-} ]] || WORKER_PIN=(taskset -c "$BENCH_WORKER_CPUS")
PORT_BASE=${BENCH_PORT_BASE:-18800}
APP_PORT=$((PORT_BASE + 1)) FLEET_PORT=$((PORT_BASE + 10)) PG_PORT=$((PORT_BASE + 32))
REDIS_PORT=$((PORT_BASE + 33))
REDIS_URL=${BENCH_REDIS_URL:-}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RUN_DIR=$WORK/runs/$WORLD-$STAMP
JSON=${JSON:-$REPO/bench-results/e2e-$WORLD-$STAMP.json}
SECRET=bench-$RANDOM$RANDOM$RANDOM
mkdir -p "$RUN_DIR" "$(dirname "$JSON")"
log() { printf '[bench-e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# --- cleanup: everything this script started, by pid ------------------------------------------
PIDS=() PG_DATA=""
declare -A NAMES
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
  if [[ -n $PG_DATA && -f $PG_DATA/postmaster.pid ]]; then pg_as "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null 2>&1 || true; fi
  if [[ -n $PG_DATA && ${BENCH_KEEP:-0} != 1 ]]; then rm -rf "$PG_DATA"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# start NAME CMD... : runs CMD in its own process group, logs to $RUN_DIR/NAME.log, sets $LAST_PID
start() {
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
  NAMES[$LAST_PID]=$name
}
all_alive() {  # every process this script started is still running (else: say which, return 1)
  local pid dead=0
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || { log "${NAMES[$pid]} (pid $pid) is gone; see $RUN_DIR/${NAMES[$pid]}.log"; dead=1; }
  done
  return $dead
}
wait_http() {  # wait_http URL NAME PID: up to 120 s
  local deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    curl -fsS -m 2 -o /dev/null "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { log "$2 exited; its log:"; tail -30 "$RUN_DIR/$2.log" >&2; exit 2; }
    sleep 0.2
  done
  log "$2 did not answer at $1"; tail -30 "$RUN_DIR/$2.log" >&2; exit 2
}

# --- the app: install (npm registry + the tarball) and build, both cached in $WORK/app ---------
APP=$WORK/app
mkdir -p "$APP"
install_key=$(cat "$HERE/app/package.json" "$TARBALL" | sha256sum | cut -c1-16)
if [[ ! -f $APP/.installed-$install_key ]]; then
  log "installing the app's npm packages into $APP"
  rm -rf "$APP/node_modules" "$APP/package-lock.json" "$APP"/.installed-* "$APP"/.built-*
  cp "$HERE/app/package.json" "$APP/package.json"
  (cd "$APP" && nice -n 10 npm install --no-audit --no-fund --loglevel=error "$TARBALL" >"$RUN_DIR/npm-install.log" 2>&1) \
    || { tail -30 "$RUN_DIR/npm-install.log" >&2; exit 2; }
  touch "$APP/.installed-$install_key"
fi
cp -r "$HERE/app/nitro.config.ts" "$HERE/app/src" "$HERE/app/workflows" "$HERE/app/plugins" "$HERE/reference-fleet.mjs" "$APP/"
build_key=$( (cd "$HERE" && find app/nitro.config.ts app/src app/workflows app/plugins -type f | sort | xargs cat; echo "$install_key") | sha256sum | cut -c1-16)
if [[ ! -f $APP/.built-$build_key ]]; then
  log "building the app (nitro build)"
  rm -f "$APP"/.built-*
  (cd "$APP" && nice -n 10 npx nitro build >"$RUN_DIR/nitro-build.log" 2>&1) || { tail -30 "$RUN_DIR/nitro-build.log" >&2; exit 2; }
  touch "$APP/.built-$build_key"
fi

# --- a private PostgreSQL cluster (fresh per run) ----------------------------------------------
PG_LOG_OPTS=""
if [[ ${BENCH_PG_LOG:-0} == 1 ]]; then
  PG_LOG_OPTS="-c log_statement=all -c 'log_line_prefix=%m|%a|%p|%x|'"  # pg_ctl runs it through sh
fi
if [[ ${BENCH_PG_STATS:-0} == 1 ]]; then
  PG_LOG_OPTS+=" -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on"
fi
pg_stats_dump() {  # pg_stats_dump DB: the top statements by execution + planning time, after the run
  [[ ${BENCH_PG_STATS:-0} == 1 ]] || return 0
  psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$1" -X -q -P pager=off -c "
    SELECT calls, round(total_exec_time::numeric, 1) AS exec_ms, round(total_plan_time::numeric, 1) AS plan_ms,
           round(((total_exec_time + total_plan_time) * 1000 / greatest(calls, 1))::numeric, 1) AS us_per_call,
           rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query
      FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 40" \
    >"$RUN_DIR/pg_stat_statements.txt" 2>&1 || true
  log "pg_stat_statements: $RUN_DIR/pg_stat_statements.txt"
}
PG_BIN=${PG_BIN:-$( (pg_config --bindir 2>/dev/null) || dirname "$(readlink -f "$(command -v initdb)")")}
pg_as() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
start_pg() {  # sets PG_URL_BASE, PG_PID
  local pg=$RUN_DIR/pg
  PG_DATA=$pg/data
  mkdir -p "$pg"
  if [[ $(id -u) == 0 ]]; then chown postgres "$pg"; chmod 755 "$WORK" "$WORK/runs" "$RUN_DIR"; fi
  pg_as "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$RUN_DIR/initdb.log" 2>&1 \
    || { tail -20 "$RUN_DIR/initdb.log" >&2; exit 2; }
  pg_as "$PG_BIN/pg_ctl" -D "$PG_DATA" -w -l "$pg/postgres.log" \
    -o "-p $PG_PORT -k $pg -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=128MB $PG_LOG_OPTS" start >/dev/null \
    || { tail -20 "$pg/postgres.log" >&2; exit 2; }
  PG_PID=$(head -1 "$PG_DATA/postmaster.pid")
  PG_URL_BASE=postgres://postgres@127.0.0.1:$PG_PORT
  log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (pid $PG_PID, fresh cluster)"
}

python_for_checkout() {
  local py=${BENCH_PYTHON:-$REPO/.venv/bin/python}
  if [[ ! -x $py ]]; then
    log "creating $REPO/.venv (pip install -e .)"
    python3 -m venv "$REPO/.venv" && nice -n 10 "$REPO/.venv/bin/pip" install -q -e "$REPO" >&2
    py=$REPO/.venv/bin/python
  fi
  echo "$py"
}

# --- the World ------------------------------------------------------------------------------
PROCS=()
APP_ENV=(NODE_ENV=production PORT=$APP_PORT NITRO_PORT=$APP_PORT HOST=127.0.0.1 NITRO_HOST=127.0.0.1
         WORKFLOW_BASE_URL=http://127.0.0.1:$APP_PORT WORKFLOW_LOCAL_BASE_URL=http://127.0.0.1:$APP_PORT)
celld_env() { APP_ENV+=(WORKFLOW_TARGET_WORLD=@ewhauser/world-celld CELLD_FLEET_URL=http://127.0.0.1:$FLEET_PORT CELLD_WORLD_SECRET=$SECRET); }

case $WORLD in
  worldcell-pg|worldcell-pg-gunicorn)
    PY=$(python_for_checkout); BIN=$(dirname "$PY")
    start_pg
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres worldcell
    STATS_DB=worldcell
    [[ ${BENCH_PG_STATS:-0} != 1 ]] || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d worldcell -X -q -c 'CREATE EXTENSION pg_stat_statements'
    export DATABASE_URL=$PG_URL_BASE/worldcell WORLD_SECRET=$SECRET CELERY_BROKER_URL=$REDIS_URL \
           WORLDCELL_DATA_DIR=$RUN_DIR/data DJANGO_ALLOWED_HOSTS=127.0.0.1,localhost WORLDCELL_LOG_LEVEL=WARNING
    mkdir -p "$RUN_DIR/data"
    if [[ -z $REDIS_URL ]]; then
      start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no
      PROCS+=(--proc "redis=$LAST_PID")
      REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
      for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    fi
    export CELERY_BROKER_URL=$REDIS_URL
    "$PY" -c "import redis,sys; redis.Redis.from_url(sys.argv[1]).flushdb()" "$REDIS_URL"
    (cd "$REPO" && "$PY" manage.py migrate -v 0)
    cd "$REPO"
    DB_URL=$DATABASE_URL  # BENCH_PG_LOG: each process names its role in PostgreSQL's log
    app_db() { if [[ ${BENCH_PG_LOG:-0} == 1 ]]; then echo "$DB_URL?application_name=$1"; else echo "$DB_URL"; fi; }
    if [[ $WORLD == worldcell-pg ]]; then
      # the README's production API command (and contrib/systemd/worldcell-api.service), same flags
      API=waitress
      start waitress "${API_PIN[@]}" env DATABASE_URL="$(app_db api)" "$BIN/waitress-serve" --listen "127.0.0.1:$FLEET_PORT" --threads "${BENCH_WAITRESS_THREADS:-8}" \
        --connection-limit 500 --max-request-body-size 34603008 --channel-timeout 30 --cleanup-interval 10 \
        --call worldcell.wsgi:checked_application
    else
      API=gunicorn
      mkdir -p "$RUN_DIR/prometheus"
      start gunicorn "${API_PIN[@]}" env DATABASE_URL="$(app_db api)" PROMETHEUS_MULTIPROC_DIR="$RUN_DIR/prometheus" "$BIN/gunicorn" -c python:worldcell.gunicorn_conf worldcell.wsgi:application \
        --bind "127.0.0.1:$FLEET_PORT" --worker-class gthread --workers 3 --threads 8 --timeout 120
    fi
    PROCS+=(--proc "$API=$LAST_PID"); API_PID=$LAST_PID
    start celery-worker "${WORKER_PIN[@]}" env DATABASE_URL="$(app_db worker)" "$BIN/celery" -A worldcell worker --pool threads --concurrency 16 \
      --without-gossip --without-mingle --loglevel WARNING
    PROCS+=(--proc "celery-worker=$LAST_PID")
    start celery-beat env DATABASE_URL="$(app_db beat)" "$BIN/celery" -A worldcell beat --schedule "$RUN_DIR/data/celerybeat-schedule" --loglevel WARNING
    PROCS+=(--proc "celery-beat=$LAST_PID" --proc "postgres=$PG_PID" --pg-url "$PG_URL_BASE/postgres")
    cd "$HERE"
    wait_http "http://127.0.0.1:$FLEET_PORT/v1/health" "$API" "$API_PID"
    celld_env ;;
  worldcell-sqlite)
    PY=$(python_for_checkout)
    unset DATABASE_URL
    cd "$REPO"
    WORLD_SECRET=$SECRET WORLDCELL_DATA_DIR=$RUN_DIR/data WORLDCELL_LOG_LEVEL=WARNING \
      start devfleet "${API_PIN[@]}" "$PY" manage.py devfleet --host 127.0.0.1 --port "$FLEET_PORT"
    cd "$HERE"
    PROCS+=(--proc "devfleet=$LAST_PID")
    wait_http "http://127.0.0.1:$FLEET_PORT/v1/health" devfleet "$LAST_PID"
    celld_env ;;
  world-postgres)
    start_pg
    "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres world
    STATS_DB=world
    [[ ${BENCH_PG_STATS:-0} != 1 ]] || psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d world -X -q -c 'CREATE EXTENSION pg_stat_statements'
    APP_ENV+=(WORKFLOW_TARGET_WORLD=@workflow/world-postgres WORKFLOW_POSTGRES_URL=$PG_URL_BASE/world)
    (cd "$APP" && WORKFLOW_POSTGRES_URL=$PG_URL_BASE/world node node_modules/@workflow/world-postgres/bin/setup.js \
      >"$RUN_DIR/bootstrap.log" 2>&1) || { tail -20 "$RUN_DIR/bootstrap.log" >&2; exit 2; }
    PROCS+=(--proc "postgres=$PG_PID" --pg-url "$PG_URL_BASE/postgres") ;;
  world-local)
    APP_ENV+=(WORKFLOW_TARGET_WORLD=local WORKFLOW_LOCAL_DATA_DIR=$RUN_DIR/local-data) ;;
  reference)
    cd "$APP"
    start reference node reference-fleet.mjs --port "$FLEET_PORT" --secret "$SECRET"
    cd "$HERE"
    PROCS+=(--proc "reference=$LAST_PID")
    wait_http "http://127.0.0.1:$FLEET_PORT/v1/health" reference "$LAST_PID"
    celld_env ;;
esac

if [[ $FLEET_ONLY == 1 ]]; then
  [[ ${#PROCS[@]} -gt 0 ]] || { echo "--fleet-only needs a World with a fleet" >&2; exit 2; }
  pids=$(printf '%s\n' "${PROCS[@]}" | sed -n 's/^[a-z-]*=\([0-9]*\)$/\1/p' | paste -sd,)
  all_alive || exit 2
  log "$WORLD ready; uptime: $(uptime)"
  echo "fleet ready: http://127.0.0.1:$FLEET_PORT $SECRET $pids"
  while all_alive; do sleep 1; done
  exit 1
fi

cd "$APP"
start app env "${APP_ENV[@]}" node .output/server/index.mjs
APP_PID=$LAST_PID
cd "$HERE"
wait_http "http://127.0.0.1:$APP_PORT/bench/health" app "$APP_PID"
sleep 1
all_alive || exit 2
log "$WORLD ready; uptime: $(uptime)"

set +e
python3 "$HERE/driver.py" --app "http://127.0.0.1:$APP_PORT" --runs "$RUNS" --inflight "$INFLIGHT" \
  --warmup "$WARMUP" --label "$WORLD" --proc "app=$APP_PID" "${PROCS[@]}" --json "$JSON" &
DRIVER_PID=$!
PIDS+=("$DRIVER_PID"); NAMES[$DRIVER_PID]=driver
wait "$DRIVER_PID"
rc=$?
unset 'PIDS[-1]'
set -e
all_alive || { log "a fleet or app process died during the run: the figures are not valid"; rc=1; }
[[ -z ${STATS_DB:-} ]] || pg_stats_dump "$STATS_DB"
log "result JSON: $JSON; logs: $RUN_DIR"
exit $rc
