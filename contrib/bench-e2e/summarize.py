#!/usr/bin/env python3
"""Medians of several end-to-end rounds, one Markdown table row per World.

    python3 contrib/bench-e2e/summarize.py bench-results/e2e-*.json

Reads the JSON documents driver.py writes (one per round), groups them by ``label`` and prints, per
World: rounds, median runs/s (and each round's), median latency p50/p99 (ms), median start() p50
(ms), median CPU ms per run of each process group (``fleet`` = everything but the app, the driver
and "other"; a large "other" = CPU of other tenants during the round), median PostgreSQL commits
(read-only included), writing transactions and WAL flushes per run, fleet RPCs per run, and the 1-minute load average before each round.
Standard library only.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

NOT_FLEET = {"app", "driver", "other", "machine"}
PG_KEYS = ("pg_commits_per_run", "pg_write_xacts_per_run", "pg_wal_syncs_per_run")


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, nd=1):
    return "–" if v is None else f"{v:.{nd}f}"


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    by_world: dict[str, list[dict]] = defaultdict(list)
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        by_world[doc["label"]].append(doc)
    print("| World | rounds | runs/s (each round) | p50 ms | p99 ms | start() p50 ms "
          "| CPU ms/run: app | fleet | fleet split | other | PG commits / writes / WAL flushes per run "
          "| fleet RPCs/run "
          "| load 1-min before |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for world, docs in sorted(by_world.items()):
        docs.sort(key=lambda d: d["time_utc"])
        cpu_names = sorted({k for d in docs for k in d["cpu_ms_per_run"]} - NOT_FLEET)
        split = {n: med([d["cpu_ms_per_run"].get(n) for d in docs]) for n in cpu_names}
        fleet = med([sum(d["cpu_ms_per_run"].get(n, 0) for n in cpu_names) for d in docs]) if cpu_names else None
        failed = sum(d["failed"] for d in docs)
        rps = ", ".join(fmt(d["runs_per_s"], 2) for d in docs)
        print(f"| {world} | {len(docs)}{f' ({failed} failed runs)' if failed else ''} "
              f"| **{fmt(med([d['runs_per_s'] for d in docs]), 2)}** ({rps}) "
              f"| {fmt(med([d['latency_ms']['p50'] for d in docs]), 0)} "
              f"| {fmt(med([d['latency_ms']['p99'] for d in docs]), 0)} "
              f"| {fmt(med([d['start_ms']['p50'] for d in docs]), 0)} "
              f"| {fmt(med([d['cpu_ms_per_run'].get('app') for d in docs]))} "
              f"| {fmt(fleet)} "
              f"| {', '.join(f'{n} {fmt(v)}' for n, v in split.items()) or '–'} "
              f"| {fmt(med([d['cpu_ms_per_run'].get('other') for d in docs]), 0)} "
              f"| {' / '.join(fmt(med([d.get(k) for d in docs])) for k in PG_KEYS)} "
              f"| {fmt(med([d.get('rpcs_per_run_total') or None for d in docs]))} "
              f"| {', '.join(d['load_before'].split()[0] for d in docs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
