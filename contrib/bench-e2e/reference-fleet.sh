#!/usr/bin/env bash
# Starts world-celld's in-memory reference fleet from a world-celld client tarball, for side by
# side micro runs with contrib/bench-micro/bench.py (see docs/benchmarks.md):
#
#   contrib/bench-e2e/reference-fleet.sh <world-celld-0.1.0.tgz> --port N --secret S
#
# Installs the tarball (and its npm dependencies) into $BENCH_WORK/reference (default
# /tmp/worldcell-bench-e2e/reference), then replaces itself with the fleet's node process
# (`exec`, so this script's pid is the server's pid for bench.py --server-pid). Listens on
# 127.0.0.1:N only; state is in memory; stop it with SIGTERM or Ctrl-C.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
TARBALL=$(realpath "$1"); shift
[[ -f $TARBALL ]] || { echo "no such tarball: $TARBALL" >&2; exit 2; }
PORT="" SECRET=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --port) PORT=$2; shift 2 ;;
    --secret) SECRET=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
[[ -n $PORT && -n $SECRET ]] || usage

DIR=${BENCH_WORK:-/tmp/worldcell-bench-e2e}/reference
mkdir -p "$DIR"
key=$(sha256sum "$TARBALL" | cut -c1-16)
if [[ ! -f $DIR/.installed-$key ]]; then
  echo "[reference-fleet] installing $TARBALL into $DIR" >&2
  rm -rf "$DIR/node_modules" "$DIR/package.json" "$DIR/package-lock.json" "$DIR"/.installed-*
  echo '{"name":"worldcell-bench-reference","private":true,"type":"module"}' >"$DIR/package.json"
  (cd "$DIR" && nice -n 10 npm install --no-audit --no-fund --loglevel=error "$TARBALL" >&2)
  touch "$DIR/.installed-$key"
fi
cp "$HERE/reference-fleet.mjs" "$DIR/"
cd "$DIR"
exec node reference-fleet.mjs --port "$PORT" --secret "$SECRET"
