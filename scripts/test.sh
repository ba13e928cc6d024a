#!/usr/bin/env bash
# Run the whole test suite on PostgreSQL (throwaway test databases) and on SQLite, both passes at
# once, each spread over pytest-xdist workers; print each pass's result and the slowest tests.
# Installs the project into ./.venv first and starts PostgreSQL / Redis if they are down.
#
#   scripts/test.sh                 everything, both databases (what CI runs)
#   scripts/test.sh --quick         the edit loop: leaves out the slow process-level tests
#                                   (marker "slow": real servers, Celery, faults, chaos)
#   scripts/test.sh -k queue -x     extra arguments go to pytest (in both passes)
#
# TEST_JOBS_POSTGRES (default 3) and TEST_JOBS_SQLITE (default 2) are the xdist workers of each
# pass (the PostgreSQL pass holds the long process-level tests); TEST_JOBS=N sets both, 0 runs a
# pass in one process. TEST_PASSES=postgres or TEST_PASSES=sqlite runs one pass only.
# TEST_JUNIT_DIR=D writes D/postgres.xml and D/sqlite.xml (per-test times, for tables).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

QUICK=0
ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--quick" ]; then QUICK=1; else ARGS+=("$arg"); fi
done

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
DATA=${WORLDCELL_DATA_DIR:-$ROOT/data/test}
JOBS_postgres=${TEST_JOBS_POSTGRES:-${TEST_JOBS:-3}}
JOBS_sqlite=${TEST_JOBS_SQLITE:-${TEST_JOBS:-2}}
PASSES=${TEST_PASSES:-postgres sqlite}
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/worldcell-tests.XXXXXX")

COMMON=(--durations=15 --durations-min=2)
MARKS_PG=""   # everything
MARKS_SQLITE="not postgres_only and not any_database"
if [ $QUICK = 1 ]; then
  MARKS_PG="not slow and not celery"
  MARKS_SQLITE="$MARKS_SQLITE and not slow and not celery"
fi

# One pass: DATABASE_URL, marker expression, its own data folder; output to $LOGS/<name>.log.
run_pass() {
  local name=$1 url=$2 marks=$3 jobs_var="JOBS_$1"
  local own=()
  [ "${!jobs_var}" != 0 ] && own+=(-n "${!jobs_var}" --dist loadfile)
  [ -n "${TEST_JUNIT_DIR:-}" ] && own+=(--junitxml "$TEST_JUNIT_DIR/$name.xml")
  mkdir -p "$DATA/$name/static"   # STATIC_ROOT: whitenoise warns on every client without it
  WORLDCELL_DATA_DIR="$DATA/$name" DATABASE_URL=$url \
    .venv/bin/python -m pytest ${marks:+-m "$marks"} "${COMMON[@]}" "${own[@]}" ${ARGS[@]+"${ARGS[@]}"} \
    >"$LOGS/$name.log" 2>&1
}

started=$(date +%s)
declare -A PIDS
for pass in $PASSES; do
  case $pass in
    postgres) run_pass postgres "$PG_URL" "$MARKS_PG" & ;;
    sqlite) run_pass sqlite "sqlite:///$DATA/sqlite/worldcell.sqlite3" "$MARKS_SQLITE" & ;;
    *) echo "test.sh: unknown pass '$pass' in TEST_PASSES" >&2; exit 2 ;;
  esac
  PIDS[$pass]=$!
done
echo "=== worldcell tests: passes [$PASSES] at once (xdist workers: postgres $JOBS_postgres, sqlite $JOBS_sqlite)$([ $QUICK = 1 ] && echo ', --quick'); logs in $LOGS ==="

status=0
for pass in $PASSES; do
  s=0
  wait "${PIDS[$pass]}" || s=$?
  echo
  echo "=== worldcell tests on $([ "$pass" = postgres ] && echo "PostgreSQL ($PG_URL)" || echo SQLite) (exit $s) ==="
  cat "$LOGS/$pass.log"
  [ $s -ne 0 ] && [ $status -eq 0 ] && status=$s
done
echo
echo "worldcell: wall time $(( $(date +%s) - started )) s for [$PASSES]"
if [ $status -eq 0 ]; then echo "worldcell: all test runs passed"; else echo "worldcell: test runs FAILED (exit $status)"; fi
exit $status
