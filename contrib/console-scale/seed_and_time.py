#!/usr/bin/env python3
"""Seed a million runs into a PostgreSQL database and time the console's pages (docs/console.md "At a million runs").

    .venv/bin/python contrib/console-scale/seed_and_time.py \
        --database postgres://postgres@127.0.0.1:5432/wc_console_scale --runs 1000000 [--keep]

Creates the database (dropped at the end unless ``--keep``; an existing one
with runs is reused as it is), migrates it, then writes with set-based SQL
(``INSERT … SELECT generate_series``, batches of 100,000): run cells with
ULID-like ids, runs in mixed states (70 % completed, 10 % failed with a
two-line error, 15 % running, 4 % pending, 1 % cancelled) over 12 workflows
and 7 deployments, one second apart; plus one 200-step run with its events
and hooks (``tests.admin.support.seed_runs``). ``ANALYZE`` follows.

Then each page is requested ``--rounds`` times in-process (Django's test
client, a superuser session) and the median wall time and the query count
are printed, one line per page: the run list, a status filter, searches
(substring, prefix, workflow, an id that matches nothing), the run-id jump,
the 200-step run page and its live fragment, and the list's live fragment.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
BATCH = 100_000

SEED_SQL = """
WITH cells AS (
  INSERT INTO cells_runcellstate (name, event_sequence, schema_version, expired)
  SELECT 'wrun_01J' || upper(substr(md5(g::text), 1, 10)) || lpad(g::text, 8, '0'), 2, 3, false
  FROM generate_series(%(first)s::int, %(last)s::int) g
  RETURNING id, name
)
INSERT INTO cells_run (cell_id, status, deployment_id, workflow_name, spec_version, input, error,
                       started_at, completed_at, created_at, updated_at)
SELECT id,
       CASE WHEN n %% 100 < 70 THEN 'completed' WHEN n %% 100 < 80 THEN 'failed' WHEN n %% 100 < 95 THEN 'running'
            WHEN n %% 100 < 99 THEN 'pending' ELSE 'cancelled' END,
       'dpl_2026_' || (n %% 7),
       (ARRAY['wf-checkout','wf-refund','wf-ship','wf-invoice','wf-signup','wf-email','wf-report','wf-sync',
              'wf-import','wf-export','wf-billing','wf-onboard'])[1 + n %% 12],
       3, '[{"orderId":' || n || '}]',
       CASE WHEN n %% 100 BETWEEN 70 AND 79 THEN '{"message":"card declined for order ' || n || E'\\\\nat charge (pay.ts:12)","code":"E_CARD"}' END,
       t, CASE WHEN n %% 100 < 80 OR n %% 100 = 99 THEN t + interval '2 seconds' END, t, t + interval '2 seconds'
FROM (SELECT id, substr(name, 19)::int AS n, %(t0)s::timestamptz + (substr(name, 19)::int * interval '1 second') AS t FROM cells) c
"""


def _connect(url: str, dbname: str | None = None):
    info = psycopg.conninfo.conninfo_to_dict(url)
    if dbname:
        info["dbname"] = dbname
    return psycopg.connect(**info, autocommit=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", required=True, help="postgres://… URL of the database to create and fill")
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="do not drop the database at the end")
    args = ap.parse_args()

    name = psycopg.conninfo.conninfo_to_dict(args.database)["dbname"]
    with _connect(args.database, "postgres") as admin:
        created = not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if created:
            admin.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = args.database
    os.environ.setdefault("WORLDCELL_NO_BOOTSTRAP", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    try:
        with _connect(args.database) as conn:
            have = conn.execute("SELECT count(*) FROM cells_run").fetchone()[0]
            if have == 0:
                started = time.monotonic()
                for first in range(1, args.runs + 1, BATCH):
                    last = min(first + BATCH - 1, args.runs)
                    conn.execute(SEED_SQL, {"first": first, "last": last, "t0": "2026-11-01T00:00:00Z"})
                    print(f"seeded runs {first:,}–{last:,} ({time.monotonic() - started:.0f} s)", flush=True)
                from tests.admin.support import seed_runs

                seed_runs(1, 200, hooks=3, first=900_000_000, start=None)
                conn.execute("ANALYZE")
                print(f"seeded {args.runs:,} runs + one 200-step run in {time.monotonic() - started:.0f} s", flush=True)
            else:
                print(f"reusing {have:,} runs already in {name}", flush=True)
        _time_pages(args.rounds)
    finally:
        if created and not args.keep:
            from django.db import connections

            connections.close_all()
            with _connect(args.database, "postgres") as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def _time_pages(rounds: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from cells.models import Run

    user = User.objects.filter(username="scale-ops").first() or User.objects.create_superuser("scale-ops", "s@x", "pw")
    client = Client()
    client.force_login(user)
    big = Run.objects.get(cell__name="wrun_seed900000000")
    some_id = Run.objects.filter(status="failed").order_by("-created_at").values_list("cell__name", flat=True)[5]
    runs = "/admin/cells/run/"
    pages = [
        ("run list (newest 100)", runs, {}),
        ("run list, status=failed", runs, {"status__exact": "failed"}),
        ("run list, workflow filter", runs, {"workflow_name": "wf-ship"}),
        ("search substring of a run id", runs, {"q": some_id[8:16]}),
        ("search run-id prefix", runs, {"q": some_id[:14]}),
        ("search workflow substring 'refund'", runs, {"q": "refund"}),
        ("search nothing matches", runs, {"q": "no-such-thing-zz"}),
        ("run-id jump (unique prefix)", f"{runs}jump/", {"prefix": some_id[:20]}),
        ("run list live fragment", runs, {"_fragment": "results"}),
        ("run page, 200 steps", f"{runs}{big.pk}/change/", {}),
        ("run page live fragment", f"{runs}{big.pk}/live/", {}),
    ]
    print(f"{'page':40s} {'median ms':>10s} {'min ms':>8s} {'queries':>8s}  status")
    for label, url, params in pages:
        times, queries, status = [], 0, None
        for _ in range(rounds):
            with CaptureQueriesContext(connection) as ctx:
                t = time.perf_counter()
                response = client.get(url, params)
                times.append((time.perf_counter() - t) * 1000)
            queries, status = len(ctx.captured_queries), response.status_code
        print(f"{label:40s} {statistics.median(times):10.1f} {min(times):8.1f} {queries:8d}  {status}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
