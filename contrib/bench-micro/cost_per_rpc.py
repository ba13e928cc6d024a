#!/usr/bin/env python3
"""Server CPU and commits per RPC, one wire method at a time (docs/benchmarks.md "Micro").

For each fleet given with ``--fleet NAME=URL,API_PID,DATABASE`` it sends ``--rpcs`` calls of one
method (``applyEvent``, ``index.put``, ``writeChunk`` or ``enqueue``) from ``--concurrency`` threads, and reads

* the API process's CPU (``/proc/<pid>/stat`` utime + stime, all threads),
* the CPU of every PostgreSQL backend connected to ``DATABASE`` (``/proc/*/cmdline`` is
  ``postgres: <user> <database> …``; give each fleet its own database so the backends can be told
  apart), and
* ``pg_stat_database.xact_commit`` of ``DATABASE`` (one ``psql`` call per round, 11 s after the
  load stopped: an idle backend reports its counts after 10 s)

before and after, and prints µs of CPU per RPC (API, PostgreSQL, sum) and commits per RPC.
Rounds alternate between the fleets (A B, then B A, …); the summary gives the median of each figure
and the ratio to the first fleet. Machine load (``/proc/loadavg``) is printed with each round.

Workloads (the argument shapes are those of the world-celld v0.1.0 client, docs/protocol.md):

``applyEvent``  whole runs: run_created, run_started, 3 x (step_created, step_started,
                step_completed), run_completed — 12 events per run, 64-byte payloads.
``index.put``   ``correlation:…:<runId>`` keys (run-scoped: the fence's one-statement upsert).
``writeChunk``  64-byte chunks, each thread writing its own stream (no lock waits).
``health``      ``GET /v1/health``: the HTTP server and Django's request handling with no
                authentication, no body and no database work — the floor under every RPC.
``enqueue``     step messages over 4 queue cells; ``targetBaseUrl`` is a closed local port, so
                without a worker they stay pending (bounded by ``--rpcs``).

Standard library only; ``psql`` must be on PATH. Example::

    cost_per_rpc.py --secret s --method applyEvent --rounds 4 \\
        --fleet base=http://127.0.0.1:19002,1234,wc_base --fleet new=http://127.0.0.1:19003,1240,wc_new
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError):
        return 0.0


def backends(database: str) -> dict[int, float]:
    """``{pid: cpu_s}`` of the PostgreSQL backends connected to ``database``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        parts = cmd.split(b"\0")[0].split()  # "postgres: [15/main:] <user> <database> <client> <state>"
        if parts[:1] == [b"postgres:"] and database.encode() in parts[2:4]:
            out[int(name)] = proc_cpu_s(int(name))
    return out


def commits(database: str, dsn: str) -> int:
    text = subprocess.run(
        ["psql", dsn, "-Atc", f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{database}'"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    return int(text)


class Client:
    """One keep-alive connection; ``call`` returns the decoded JSON answer (raises on non-200)."""

    def __init__(self, url: str, secret: str):
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}

    def call(self, binding: str, name: str, method: str, args: list):
        if binding == "health":  # GET /v1/health: no auth, no body, no database
            self.conn.request("GET", "/v1/health")
        else:
            path = f"/v1/rpc/{binding}/{urllib.parse.quote(name, safe='')}/{method}"
            self.conn.request("POST", path, json.dumps(args, separators=(",", ":")), self.headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{binding}.{method}: HTTP {resp.status} {data[:200]!r}")
        return json.loads(data)


def _payload(tag: str) -> dict:
    """A 64-byte Uint8Array argument."""
    return {"__type": "Uint8Array", "data": base64.b64encode((tag * 64).encode()[:64]).decode()}


def _run_events(run_id: str) -> list[dict]:
    wf, dep = "cost_wf", "dpl_cost"
    events = [
        {"eventType": "run_created", "specVersion": 3,
         "eventData": {"deploymentId": dep, "workflowName": wf, "input": _payload("i")}},
        {"eventType": "run_started", "specVersion": 3,
         "eventData": {"deploymentId": dep, "workflowName": wf, "input": _payload("i")}},
    ]
    for s in range(3):
        sid = f"step_{run_id}_{s}"
        events += [
            {"eventType": "step_created", "specVersion": 3, "correlationId": sid,
             "eventData": {"stepName": f"step//cost//s{s}", "input": _payload("s")}},
            {"eventType": "step_started", "specVersion": 3, "correlationId": sid, "eventData": {}},
            {"eventType": "step_completed", "specVersion": 3, "correlationId": sid,
             "eventData": {"result": _payload("r")}},
        ]
    events.append({"eventType": "run_completed", "specVersion": 3, "eventData": {"output": _payload("o")}})
    return events


def work_items(method: str, count: int, tag: str) -> list[list[tuple]]:
    """The calls of one round: a list of call sequences (one sequence runs on one thread, in order)."""
    if method == "applyEvent":
        runs = []
        for i in range(-(-count // 12)):
            rid = f"wrun_{tag}_{i}"
            runs.append([("runs", rid, "applyEvent", [{"runId": rid, "data": e}]) for e in _run_events(rid)])
        return runs
    if method == "health":
        return [[("health", "", "", [])] for _ in range(count)]
    if method == "index.put":
        return [[("index", "index", "put",
                  [f"correlation:step_{tag}_{i}:1764590000000:wevt_z{i:020d}:wrun_{tag}_{i // 8}",
                   json.dumps({"runId": f"wrun_{tag}_{i // 8}", "eventId": f"wevt_z{i:020d}"})])]
                for i in range(count)]
    if method == "writeChunk":
        per = -(-count // 8)
        return [[("streams", f"stream:strm_{tag}_{w}", "writeChunk", [_payload(str(i))]) for i in range(per)]
                for w in range(8)]
    if method == "enqueue":
        return [[("queue", f"q:{i % 4}", "enqueue",
                  [{"messageId": f"msg_{tag}_{i}", "queueName": "__wkf_step_cost", "pathname": "step",
                    "body": json.dumps({"stepId": f"step_{tag}_{i}", "pad": "x" * 40}), "idempotencyKey": f"step_{tag}_{i}",
                    "config": {"targetBaseUrl": "http://127.0.0.1:9", "queueShards": 4}}])]
                for i in range(count)]
    raise SystemExit(f"unknown method {method}")


def round_once(fleet: dict, args, tag: str) -> dict:
    """One round on one fleet: the API's and its backends' CPU around ``--rpcs`` calls."""
    items = work_items(args.method, args.rpcs, tag)
    lock = threading.Lock()
    sent = 0

    def worker():
        nonlocal sent
        client = Client(fleet["url"], args.secret)
        n = 0
        while True:
            with lock:
                if not items:
                    break
                seq = items.pop()
            for call in seq:
                client.call(*call)
                n += 1
        with lock:
            sent += n

    api0, pg0 = proc_cpu_s(fleet["pid"]), backends(fleet["db"])
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    api1, pg1 = proc_cpu_s(fleet["pid"]), backends(fleet["db"])
    pg = sum(v - pg0.get(pid, 0.0) for pid, v in pg1.items())
    return {
        "rpcs": sent, "wall_s": wall, "rps": sent / wall,
        "api_us": (api1 - api0) / sent * 1e6, "pg_us": pg / sent * 1e6,
        "cpu_us": (api1 - api0 + pg) / sent * 1e6,
    }


def settled_commits(fleets: list[dict], dsn: str) -> dict[str, int]:
    """``xact_commit`` of each fleet's database once its idle backends have reported (11 s)."""
    time.sleep(11)  # an idle backend reports its commit count after 10 s (PGSTAT_IDLE_INTERVAL)
    return {f["name"]: commits(f["db"], dsn) for f in fleets}


def parse_fleet(text: str) -> dict:
    name, rest = text.split("=", 1)
    url, pid, db = rest.split(",")
    return {"name": name, "url": url, "pid": int(pid), "db": db}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", action="append", required=True, type=parse_fleet, help="NAME=URL,API_PID,DATABASE")
    p.add_argument("--secret", default=os.environ.get("WORLD_SECRET", ""))
    p.add_argument("--method", choices=["health", "applyEvent", "index.put", "writeChunk", "enqueue"], required=True)
    p.add_argument("--rpcs", type=int, default=1200, help="RPCs per round (default 1200)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="rounds per fleet, alternating (default 3)")
    p.add_argument("--dsn", default="postgres://postgres@127.0.0.1:5432/postgres", help="for pg_stat_database")
    args = p.parse_args()
    results: dict[str, list[dict]] = {f["name"]: [] for f in args.fleet}
    for fleet in args.fleet:  # connections and backends exist before the first snapshot
        for _ in range(args.concurrency):
            Client(fleet["url"], args.secret).call("runs", "warm", "getRun", [])
    before = settled_commits(args.fleet, args.dsn)
    for r in range(args.rounds):
        order = args.fleet if r % 2 == 0 else args.fleet[::-1]  # A B, B A, …: no fleet always goes first
        for fleet in order:
            res = round_once(fleet, args, uuid.uuid4().hex[:10])
            results[fleet["name"]].append(res)
        after = settled_commits(args.fleet, args.dsn)
        load = " ".join(open("/proc/loadavg").read().split()[:3])
        for fleet in order:
            res = results[fleet["name"]][-1]
            # each psql snapshot commits once in its database
            res["commits"] = (after[fleet["name"]] - before[fleet["name"]] - 1) / res["rpcs"]
            print(f"round {r + 1} {fleet['name']:>8} {args.method}: {res['rps']:7.1f} RPC/s  "
                  f"API {res['api_us']:6.0f} us  PG {res['pg_us']:6.0f} us  sum {res['cpu_us']:6.0f} us/RPC  "
                  f"commits/RPC {res['commits']:.2f}  load {load}", flush=True)
        before = after
    first = args.fleet[0]["name"]
    med = {n: {k: statistics.median(x[k] for x in rs) for k in ("rps", "api_us", "pg_us", "cpu_us", "commits")}
           for n, rs in results.items()}
    print(f"\nmedians over {args.rounds} rounds ({args.method}, {args.rpcs} RPCs, {args.concurrency} threads):")
    for n, m in med.items():
        ratio = m["cpu_us"] / med[first]["cpu_us"]
        print(f"  {n:>8}: {m['rps']:7.1f} RPC/s  API {m['api_us']:6.0f}  PG {m['pg_us']:6.0f}  "
              f"sum {m['cpu_us']:6.0f} us/RPC (x{ratio:.2f} of {first})  commits/RPC {m['commits']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
