#!/usr/bin/env python3
"""Bulk-insert a population of finished runs for the retention measurement (docs/lifecycle.md §9).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/wc_retention_bench \
        python3 contrib/populate_expired_runs.py --runs 100000 --age-days 2

Writes, straight into a migrated PostgreSQL database with ``INSERT … SELECT
generate_series`` (no RPCs): for each run a run cell, a completed run, and 20
events — ``run_created``, ``run_started``, 6 × (``step_created``,
``step_started``, ``step_completed``) — plus its 6 steps and the index keys the
client writes (``run:``, ``runall:``, one ``correlation:`` key per step event).
Every run completed ``--age-days`` ago, so ``WORLDCELL_RUN_RETENTION=1d``
makes all of them due. Run ids are ``wrun_pop<8 digits>``.
"""
from __future__ import annotations

import argparse
import os
import time

import psycopg

STEPS = 6

SQL = """
WITH cells AS (
  INSERT INTO cells_runcellstate (name, event_sequence, schema_version, expired)
  SELECT 'wrun_pop' || lpad(g::text, 8, '0'), 20, 3, false FROM generate_series(%(first)s::int, %(last)s::int) g
  RETURNING id, name
), runs AS (
  INSERT INTO cells_run (cell_id, status, deployment_id, workflow_name, spec_version, input, output,
                         started_at, completed_at, created_at, updated_at)
  SELECT id, 'completed', 'dpl_pop', 'wf_pop', 3, '{"__type":"Uint8Array","data":"aW5wdXQ="}',
         '{"__type":"Uint8Array","data":"b3V0cHV0"}', %(t0)s::timestamptz, %(t0)s::timestamptz, %(t0)s::timestamptz, %(t0)s::timestamptz FROM cells
  RETURNING cell_id
), steps AS (
  INSERT INTO cells_step (run_id, step_id, step_name, status, attempt, input, output, started_at, completed_at,
                          created_at, updated_at, spec_version, sort_key)
  SELECT c.id, 'step_' || s, 'work', 'completed', 1, '{"__type":"Uint8Array","data":"aW4="}',
         '{"__type":"Uint8Array","data":"b3V0"}', %(t0)s::timestamptz, %(t0)s::timestamptz, %(t0)s::timestamptz, %(t0)s::timestamptz, 3,
         %(iso)s || ':step_' || s
  FROM cells c CROSS JOIN generate_series(1, %(steps)s::int) s
  RETURNING run_id
), events AS (
  INSERT INTO cells_event (run_id, event_id, sequence, event_type, correlation_id, created_at, body)
  SELECT c.id, 'wevt_z' || lpad(e.seq::text, 20, '0'), e.seq, e.kind, e.corr, %(t0)s::timestamptz,
         json_build_object('eventType', e.kind, 'runId', c.name, 'eventId', 'wevt_z' || lpad(e.seq::text, 20, '0'),
                           'correlationId', e.corr, 'specVersion', 3,
                           'createdAt', json_build_object('__type', 'Date', 'iso', %(iso)s))::text
  FROM cells c CROSS JOIN (
    SELECT 1 AS seq, 'run_created' AS kind, NULL::text AS corr UNION ALL SELECT 2, 'run_started', NULL
    UNION ALL SELECT 2 + (s - 1) * 3 + k, (ARRAY['step_created', 'step_started', 'step_completed'])[k], 'step_' || s
    FROM generate_series(1, %(steps)s::int) s CROSS JOIN generate_series(1, 3) k
  ) e
  RETURNING run_id
), listing AS (
  INSERT INTO cells_indexentry (tenant, cell, key, value)
  SELECT 'default', 'index', k.prefix || c.name, '"{}"' FROM cells c
  CROSS JOIN (VALUES ('run:wf_pop:' || %(ms13)s || ':'), ('runall:' || %(ms13)s || ':')) k(prefix)
  RETURNING 1
), corr AS (
  INSERT INTO cells_indexentry (tenant, cell, key, value)
  SELECT 'default', 'index', 'correlation:step_' || s || ':' || %(ms13)s || ':wevt_z' || lpad((2 + (s - 1) * 3 + k)::text, 20, '0')
         || ':' || c.name, '"{}"'
  FROM cells c CROSS JOIN generate_series(1, %(steps)s::int) s CROSS JOIN generate_series(1, 3) k
  RETURNING 1
)
SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps), (SELECT count(*) FROM events),
       (SELECT count(*) FROM listing) + (SELECT count(*) FROM corr)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--age-days", type=float, default=2.0, help="how long ago every run completed")
    ap.add_argument("--chunk", type=int, default=5_000, help="runs per INSERT statement")
    args = ap.parse_args()
    url = os.environ["DATABASE_URL"]
    t0_ms = int((time.time() - args.age_days * 86400) * 1000)
    t0 = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0_ms / 1000)) + f".{t0_ms % 1000:03d}Z"
    started = time.monotonic()
    totals = [0, 0, 0, 0]
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, args.runs + 1, args.chunk):
            last = min(args.runs, first + args.chunk - 1)
            row = conn.execute(SQL, {"first": first, "last": last, "t0": t0, "iso": t0, "ms13": str(t0_ms).zfill(13),
                                     "steps": STEPS}).fetchone()
            totals = [a + b for a, b in zip(totals, row)]
        conn.execute("ANALYZE")
    print(f"runs {totals[0]}, steps {totals[1]}, events {totals[2]}, index keys {totals[3]} "
          f"in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
