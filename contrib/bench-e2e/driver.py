#!/usr/bin/env python3
"""End-to-end benchmark driver: keeps N workflow runs in flight against the bench app.

Each run is one ``POST <app>/bench/run?seed=i``; the app starts ``benchFlow`` (5 steps) and answers
when the World has acknowledged the run's terminal event (see app/src/completions.ts), with the
run's start() time and its start -> completed latency, both in ms measured inside the app.
Standard library only (Python 3.11).

Measures, over the measured runs only (``--warmup`` runs go first and are not counted):
  runs/s          completed runs / wall seconds from the first measured start to the last answer
  latency         p50 / p99 / max of start() call -> terminal event acknowledged (ms)
  start           p50 / p99 of the start() call alone (ms)
  CPU per run     for every ``--proc NAME=PID``: CPU ms of that process and all its descendants
                  (utime+stime+cutime+cstime from /proc/<pid>/stat, sampled before and after the
                  measured runs) divided by the completed runs; ``--proc`` may repeat a NAME to sum
                  several trees under it. The driver's own CPU is reported as ``driver``, and
                  ``other`` is the machine's busy CPU (/proc/stat) minus all of the above:
                  other tenants of the machine, Redis, the kernel.
  commits         with ``--pg-url``, per run, of the whole server (give it a server only this
                  World uses): committed transactions (pg_stat_database.xact_commit, read-only
                  ones included), writing transactions (transaction ids assigned) and WAL
                  flushes to disk (pg_stat_wal.wal_sync)
  RPCs per run    the world-celld client's fleet RPCs by binding.method (the app counts them;
                  empty for Worlds that make none)
  load            /proc/loadavg before and after

Exit status: 0 = every measured run completed; 1 = some run failed, timed out or errored;
2 = setup error (app unreachable, bad arguments).

Example:
    python3 driver.py --app http://127.0.0.1:18801 --runs 200 --inflight 20 \
        --proc app=1234 --proc fleet-postgres=5678 --label world-postgres --json out.json
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_table() -> dict[int, tuple[int, int]]:
    """Every live process as ``{pid: (ppid, cpu_ticks)}``; cpu_ticks = utime+stime+cutime+cstime."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        # the command name is in parentheses and may contain spaces: split after the last ')'
        fields = raw[raw.rfind(")") + 2:].split()
        ppid = int(fields[1])
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        table[int(entry)] = (ppid, ticks)
    return table


def tree_ticks(table: dict[int, tuple[int, int]], root: int) -> int:
    """CPU ticks of ``root`` and all of its live descendants (0 if root is gone)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
            stack.extend(children.get(pid, ()))
    return total


def machine_busy_ticks() -> int:
    """Busy CPU ticks of the whole machine (all of /proc/stat's cpu line except idle and iowait)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user
    return sum(fields[:8]) - fields[3] - fields[4]


def loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


PG_COUNTERS_SQL = (
    "select (select sum(xact_commit) from pg_stat_database), "
    "pg_current_xact_id()::text::bigint, (select wal_sync from pg_stat_wal)"
)


def pg_counters(url: str) -> tuple[int, int, int] | None:
    """``(commits, next xid, WAL syncs)`` of the whole PostgreSQL server at ``url`` (None if psql fails).

    ``commits`` is ``pg_stat_database.xact_commit`` (read-only transactions included); the
    transaction id advances once per transaction (or subtransaction) that wrote something, and once
    for this query itself; ``wal_sync`` counts the WAL flushes to disk (``pg_stat_wal``, PG ≥ 14).
    """
    try:
        out = subprocess.run(["psql", url, "-Atc", PG_COUNTERS_SQL],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        commits, xid, syncs = out.strip().split("|")
        return int(commits), int(xid), int(syncs or 0)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def pg_delta(c0, c1, i: int, own: int, n: int) -> float | None:
    """Per-run change of counter ``i`` of two ``pg_counters`` readings, less ``own`` of the reading itself."""
    if c0 is None or c1 is None:
        return None
    return round((c1[i] - c0[i] - own) / n, 1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[k]


class Runner:
    """Threads that each hold one keep-alive connection to the app and run one workflow at a time."""

    def __init__(self, app_url: str, timeout_s: float):
        parts = urllib.parse.urlsplit(app_url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s

    def stats(self) -> dict:
        """The app's /bench/stats document (``{}`` when it cannot be read)."""
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            conn.request("GET", "/bench/stats")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            return json.loads(body) if resp.status == 200 else {}
        except (OSError, ValueError, http.client.HTTPException):
            return {}

    def run_many(self, seeds: list[int], inflight: int) -> tuple[list[dict], float, float]:
        """Runs every seed with at most ``inflight`` at once; returns (results, t_first, t_last)."""
        lock = threading.Lock()
        pending = list(reversed(seeds))
        results: list[dict] = []

        def worker():
            conn = None
            while True:
                with lock:
                    if not pending:
                        break
                    seed = pending.pop()
                t0 = time.monotonic()
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                    conn.request("POST", f"/bench/run?seed={seed}", body=b"",
                                 headers={"content-length": "0"})
                    resp = conn.getresponse()
                    body = resp.read()
                    doc = json.loads(body) if body else {}
                    if resp.status != 200:
                        doc.setdefault("status", f"http_{resp.status}")
                except Exception as exc:  # noqa: BLE001 - any failure is a failed run, reported
                    doc = {"status": "driver_error", "error": repr(exc)}
                    if conn is not None:
                        conn.close()
                    conn = None
                doc["t0"], doc["t1"] = t0, time.monotonic()
                with lock:
                    results.append(doc)
            if conn is not None:
                conn.close()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(inflight, len(seeds)))]
        t_first = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, t_first, time.monotonic()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--app", required=True, help="bench app base URL, e.g. http://127.0.0.1:18801")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--inflight", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=20, help="runs before the measured ones (not counted)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds one run may take")
    ap.add_argument("--proc", action="append", default=[], metavar="NAME=PID",
                    help="a process tree whose CPU is reported under NAME (repeatable)")
    ap.add_argument("--pg-url", help="count this PostgreSQL server's commits per run")
    ap.add_argument("--label", default="", help="the World's name in the output")
    ap.add_argument("--json", help="write the result document here")
    args = ap.parse_args(argv)
    if args.runs <= 0 or args.inflight <= 0:
        print("--runs and --inflight must be positive", file=sys.stderr)
        return 2
    procs: list[tuple[str, int]] = []
    for spec in args.proc:
        name, _, pid = spec.partition("=")
        if not pid.isdigit():
            print(f"bad --proc {spec!r} (want NAME=PID)", file=sys.stderr)
            return 2
        procs.append((name, int(pid)))

    runner = Runner(args.app, args.timeout)
    try:
        conn = http.client.HTTPConnection(runner.host, runner.port, timeout=10)
        conn.request("GET", "/bench/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
    except Exception as exc:  # noqa: BLE001
        print(f"app not reachable at {args.app}: {exc!r}", file=sys.stderr)
        return 2

    if args.warmup:
        warm, _, _ = runner.run_many(list(range(args.warmup)), args.inflight)
        bad = [r for r in warm if r.get("status") != "completed"]
        if bad:
            print(f"warm-up: {len(bad)} of {len(warm)} runs did not complete, first: {bad[0]}",
                  file=sys.stderr)

    names = sorted({n for n, _ in procs})
    # PostgreSQL publishes a backend's counters within ~1 s of its transactions: let them settle
    commits0 = None
    if args.pg_url:
        time.sleep(1.5)
        commits0 = pg_counters(args.pg_url)
    load_before = loadavg()
    stats0 = runner.stats()
    table0 = proc_table()
    busy0 = machine_busy_ticks()
    self0 = os.times()
    before = {n: sum(tree_ticks(table0, p) for m, p in procs if m == n) for n in names}

    seeds = list(range(1000, 1000 + args.runs))
    results, t_first, t_last = runner.run_many(seeds, args.inflight)

    table1 = proc_table()
    busy1 = machine_busy_ticks()
    self1 = os.times()
    after = {n: sum(tree_ticks(table1, p) for m, p in procs if m == n) for n in names}
    load_after = loadavg()
    stats1 = runner.stats()
    commits1 = None
    if args.pg_url:
        time.sleep(1.5)
        commits1 = pg_counters(args.pg_url)

    ok = [r for r in results if r.get("status") == "completed"]
    failed = [r for r in results if r.get("status") != "completed"]
    wall = t_last - t_first
    n_ok = max(1, len(ok))
    lat = [float(r["latencyMs"]) for r in ok]
    start_ms = [float(r["startMs"]) for r in ok]
    cpu_ms = {n: (after[n] - before[n]) * 1000 / CLK_TCK / n_ok for n in names}
    driver_ms = ((self1.user + self1.system) - (self0.user + self0.system)) * 1000 / n_ok
    machine_ms = (busy1 - busy0) * 1000 / CLK_TCK / n_ok
    other_ms = machine_ms - sum(cpu_ms.values()) - driver_ms
    rpcs0, rpcs1 = stats0.get("rpcs", {}), stats1.get("rpcs", {})
    rpcs = {k: round((rpcs1.get(k, 0) - rpcs0.get(k, 0)) / n_ok, 1) for k in sorted(rpcs1)}
    rpcs = {k: v for k, v in sorted(rpcs.items(), key=lambda kv: -kv[1]) if v}
    doc = {
        "label": args.label or health.get("world"),
        "world": health.get("world"),
        "runs": args.runs, "inflight": args.inflight, "warmup": args.warmup,
        "completed": len(ok), "failed": len(failed),
        "failures": [{k: r.get(k) for k in ("runId", "status", "error")} for r in failed[:10]],
        "wall_s": round(wall, 3),
        "runs_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "latency_ms": {"p50": percentile(lat, 50), "p99": percentile(lat, 99),
                       "max": max(lat) if lat else None,
                       "mean": round(statistics.fmean(lat), 1) if lat else None},
        "start_ms": {"p50": percentile(start_ms, 50), "p99": percentile(start_ms, 99)},
        "cpu_ms_per_run": {**{n: round(v, 1) for n, v in cpu_ms.items()},
                           "driver": round(driver_ms, 1), "other": round(other_ms, 1),
                           "machine": round(machine_ms, 1)},
        "pg_commits_per_run": pg_delta(commits0, commits1, 0, 0, n_ok),
        # minus the one xid the measuring query itself takes
        "pg_write_xacts_per_run": pg_delta(commits0, commits1, 1, 1, n_ok),
        "pg_wal_syncs_per_run": pg_delta(commits0, commits1, 2, 0, n_ok),
        "rpcs_per_run": rpcs,
        "rpcs_per_run_total": round(sum(rpcs.values()), 1),
        "rpc_failures": (stats1.get("failed", 0) - stats0.get("failed", 0)) if stats1 else None,
        "load_before": load_before, "load_after": load_after,
        "machine_cpus": os.cpu_count(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print_table(doc)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
    return 0 if not failed else 1


def print_table(doc: dict) -> None:
    lat, st = doc["latency_ms"], doc["start_ms"]
    print(f"world {doc['label']}: {doc['completed']}/{doc['runs']} runs completed "
          f"({doc['failed']} failed), {doc['inflight']} in flight, {doc['wall_s']} s")
    print(f"  runs/s {doc['runs_per_s']}   latency p50 {lat['p50']:.0f} ms  p99 {lat['p99']:.0f} ms"
          f"  max {lat['max'] or float('nan'):.0f} ms   start() p50 {st['p50']:.0f} ms")
    print("  CPU ms per run: " + "  ".join(f"{k} {v}" for k, v in doc["cpu_ms_per_run"].items()))
    if doc["pg_commits_per_run"] is not None:
        print(f"  PostgreSQL per run: commits {doc['pg_commits_per_run']}  writing transactions "
              f"{doc['pg_write_xacts_per_run']}  WAL flushes {doc['pg_wal_syncs_per_run']}")
    if doc["rpcs_per_run"]:
        print(f"  fleet RPCs per run: {doc['rpcs_per_run_total']} ("
              + ", ".join(f"{k} {v}" for k, v in doc["rpcs_per_run"].items()) + ")")
    print(f"  load before {doc['load_before']}   after {doc['load_after']}")
    for f in doc["failures"][:3]:
        print(f"  failed: {f}")


if __name__ == "__main__":
    sys.exit(main())
