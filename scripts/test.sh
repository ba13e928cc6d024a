#!/usr/bin/env bash
# Run the whole test suite twice: on PostgreSQL (throwaway test database) and on SQLite.
# Installs the project into ./.venv first and starts PostgreSQL / Redis if they are down.
# Extra arguments go to pytest (e.g. scripts/test.sh -k queue -x).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f .venv/.worldcell-installed ] || [ pyproject.toml -nt .venv/.worldcell-installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -e ".[dev]"
  touch .venv/.worldcell-installed
fi

# System packages the tests use: nginx (the buffering front of contrib/nginx-gunicorn.conf).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: installing nginx-light"
  (apt-get install -y -q nginx-light >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q nginx-light >/dev/null 2>&1; }) \
    || echo "test.sh: could not install nginx-light; the nginx front tests will be skipped" >&2
fi

scripts/services.sh

PG_URL=${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/worldcell}
export WORLDCELL_DATA_DIR=${WORLDCELL_DATA_DIR:-$ROOT/data/test}
mkdir -p "$WORLDCELL_DATA_DIR"

status=0
echo "=== worldcell tests on PostgreSQL ($PG_URL) ==="
DATABASE_URL=$PG_URL .venv/bin/python -m pytest "$@" || status=$?
echo "=== worldcell tests on SQLite ==="
DATABASE_URL="sqlite:///$WORLDCELL_DATA_DIR/worldcell.sqlite3" .venv/bin/python -m pytest -m "not postgres_only" "$@" || { s=$?; [ $status -eq 0 ] && status=$s; }
if [ $status -eq 0 ]; then echo "worldcell: all test runs passed"; else echo "worldcell: test runs FAILED (exit $status)"; fi
exit $status
