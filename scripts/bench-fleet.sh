#!/usr/bin/env bash
# Start a production-shaped fleet for benchmarking: PostgreSQL + the README's API server + Celery worker + beat.
#   scripts/bench-fleet.sh start|stop   (env: BENCH_DB, BENCH_PORT, WORLD_SECRET, CELERY_CONCURRENCY,
#   API_SERVER=waitress|gunicorn, API_THREADS (waitress), GUNICORN_WORKERS, GUNICORN_THREADS)
set -euo pipefail
cd "$(dirname "$0")/.."
DB=${BENCH_DB:-worldcell_bench}
PORT=${BENCH_PORT:-8788}
export WORLD_SECRET=${WORLD_SECRET:-bench-secret}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/$DB}
export CELERY_BROKER_URL=${CELERY_BROKER_URL:-redis://127.0.0.1:6379/3}
export WORLDCELL_USE_CELERY=true WORLDCELL_DATA_DIR=${WORLDCELL_DATA_DIR:-$PWD/data/bench}
RUN=$WORLDCELL_DATA_DIR/run
mkdir -p "$RUN"
case "${1:-start}" in
  start)
    psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1 || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE \"$DB\"" >/dev/null
    .venv/bin/python manage.py migrate --noinput -v 0
    if [ "${API_SERVER:-waitress}" = gunicorn ]; then
      .venv/bin/gunicorn worldcell.wsgi:application --bind 127.0.0.1:$PORT --worker-class gthread \
        --workers ${GUNICORN_WORKERS:-3} --threads ${GUNICORN_THREADS:-8} --timeout 120 --pid $RUN/api.pid --daemon \
        --error-logfile $RUN/api.log
    else
      nohup .venv/bin/waitress-serve --listen 127.0.0.1:$PORT --threads ${API_THREADS:-8} --connection-limit 500 \
        worldcell.wsgi:application >>$RUN/api.log 2>&1 &
      echo $! >$RUN/api.pid
    fi
    .venv/bin/celery -A worldcell worker --pool threads --concurrency ${CELERY_CONCURRENCY:-16} \
      --without-gossip --without-mingle --loglevel WARNING --pidfile $RUN/worker.pid --logfile $RUN/worker.log --detach
    .venv/bin/celery -A worldcell beat --loglevel WARNING --schedule $RUN/celerybeat-schedule \
      --pidfile $RUN/beat.pid --logfile $RUN/beat.log --detach
    for _ in $(seq 1 50); do curl -sf http://127.0.0.1:$PORT/v1/health >/dev/null && break; sleep 0.2; done
    echo "fleet on http://127.0.0.1:$PORT (db $DB, secret $WORLD_SECRET)"
    ;;
  stop)
    for p in api worker beat; do [ -f $RUN/$p.pid ] && kill $(cat $RUN/$p.pid) 2>/dev/null || true; done
    sleep 2; echo stopped
    ;;
esac
