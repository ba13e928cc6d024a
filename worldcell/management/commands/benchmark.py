"""``python manage.py benchmark`` — measure a running fleet from outside, over the RPC route.

Four workloads, each driven the way the JS client drives a fleet:

* ``queue``   — N messages enqueued by C concurrent clients across S shards and
  delivered to a sink app this command serves on 127.0.0.1; every 20th message
  is answered once with 503 ``{"timeoutSeconds":0}`` and then 200. Reports
  enqueue/s, delivery/s, enqueue→delivered latency and integrity (lost,
  duplicate successes, dead letters, what is left per shard). Integrity
  failures make the command exit 1.
* ``events``  — R runs through a whole lifecycle (run_created, run_started,
  5 × step_created/started/completed, run_completed, with the client's index
  puts) by C clients: RPCs/s, runs/s, applyEvent p50/p99.
* ``listing`` — runs.list-style index pages (limit 20, fetched as the client
  does with limit 50) over a population of P run keys written in bulk: page
  p50/p99 at the first, a middle and the last page, with and without a
  workflowName prefix.
* ``streams`` — one writer appends K chunks of 1 KiB to one stream, then the
  stream is read page by page (32 chunks a page, like the client): write/s,
  chunk reads/s, first-page vs last-page time.

It prints a table and writes every figure to a JSON file. It asserts no
timings: it is a measuring tool (the test suite only smoke-tests it).
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import httpx
from django.core.management.base import BaseCommand, CommandError

from worldcell_client import RpcCallError, WorldClient, ms13

WORKLOADS = ("queue", "events", "listing", "streams")


def pct(values: list[float], p: float) -> float | None:
    """The p-th percentile (0-100, nearest rank) of ``values`` or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def summary_ms(values_s: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/max of durations given in seconds, reported in milliseconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "p99_ms": pct(ms, 99),
        "max_ms": max(ms) if ms else None,
    }


def run_parallel(n_items: int, workers: int, fn: Callable[[int], Any]) -> tuple[float, list[Any]]:
    """Run ``fn(i)`` for i in range(n_items) on ``workers`` threads; returns (seconds, results)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(fn, range(n_items)))
    return time.perf_counter() - started, results


class Sink:
    """An HTTP app on 127.0.0.1 that records queue deliveries (the ``queue`` workload's app)."""

    def __init__(self, retry_every: int = 20):
        self.lock = threading.Lock()
        self.successes: dict[str, list[float]] = {}
        self.first_attempt: dict[str, float] = {}
        self.answered_503: set[str] = set()
        self.requests = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                now = time.time()
                seq = json.loads(body)["seq"]
                status, answer = 200, b'{"ok":true}'
                with sink.lock:
                    sink.requests += 1
                    if seq % retry_every == 0 and seq not in sink.answered_503:
                        sink.answered_503.add(seq)
                        status, answer = 503, b'{"timeoutSeconds":0}'
                    else:
                        sink.successes.setdefault(seq, []).append(now)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        ThreadingHTTPServer.daemon_threads = True
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.request_queue_size = 512
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Command(BaseCommand):
    help = "Measure a running fleet over the RPC route (queue, events, listing, streams); prints a table + JSON."

    def add_arguments(self, parser):
        a = parser.add_argument
        a("--url", default=os.environ.get("CELLD_FLEET_URL", "http://127.0.0.1:8787"),
          help="fleet URL (default $CELLD_FLEET_URL or http://127.0.0.1:8787)")
        a("--secret", default=os.environ.get("CELLD_WORLD_SECRET") or os.environ.get("WORLD_SECRET"),
          help="bearer secret (default $CELLD_WORLD_SECRET, then $WORLD_SECRET)")
        a("--only", default=",".join(WORKLOADS), help="comma-separated workloads: queue,events,listing,streams")
        a("--json", default="bench-results/benchmark.json", help="where to write the figures")
        a("--label", default="", help="a label stored in the JSON (e.g. 'postgres+celery')")
        a("--messages", type=int, default=1000, help="queue: messages to enqueue (1000)")
        a("--clients", type=int, default=32, help="queue/listing: concurrent clients (32)")
        a("--shards", type=int, default=2,
          help="queue: queueShards (2); must match what the fleet's queue cells are pinned at")
        a("--body-bytes", type=int, default=256, help="queue: message body size in bytes (256)")
        a("--drain-timeout", type=float, default=120.0, help="queue: seconds to wait for deliveries (120)")
        a("--runs", type=int, default=100, help="events: runs through a full lifecycle (100)")
        a("--event-clients", type=int, default=16, help="events: concurrent clients (16)")
        a("--steps", type=int, default=5, help="events: steps per run (5)")
        a("--population", type=int, default=100_000, help="listing: run keys written before timing pages (100000)")
        a("--list-samples", type=int, default=50, help="listing: samples per page position (50)")
        a("--bulk-direct", action="store_true",
          help="listing: write the population straight into this project's DATABASE_URL with bulk "
               "inserts (it must be the fleet's database) instead of 2 index.put RPCs per run")
        a("--chunks", type=int, default=10_000, help="streams: chunks written by one writer (10000)")
        a("--chunk-bytes", type=int, default=1024, help="streams: chunk size in bytes (1024)")

    # ------------------------------------------------------------------ plumbing

    def handle(self, *args, **o):
        if not o["secret"]:
            raise CommandError("no secret: pass --secret or set CELLD_WORLD_SECRET / WORLD_SECRET")
        only = [w.strip() for w in o["only"].split(",") if w.strip()]
        unknown = set(only) - set(WORKLOADS)
        if unknown:
            raise CommandError(f"unknown workload(s): {', '.join(sorted(unknown))}")
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.http = httpx.Client(timeout=60, limits=limits)
        self.world = WorldClient(o["url"], o["secret"], http=self.http)
        try:
            health = self.world.health()
        except httpx.HTTPError as exc:
            raise CommandError(f"fleet at {o['url']} is not reachable: {exc}") from exc
        self.tag = uuid.uuid4().hex[:8]
        results: dict[str, Any] = {
            "label": o["label"], "url": o["url"], "fleet": health, "tag": self.tag,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        integrity_ok = True
        for name in only:
            self.stdout.write(f"-- {name} ...")
            self.stdout.flush()
            results[name] = getattr(self, f"bench_{name}")(o)
            if name == "queue":
                integrity_ok = results[name]["integrity"]["ok"]
        path = Path(o["json"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        self.print_table(results)
        self.stdout.write(f"figures written to {path}")
        if not integrity_ok:
            raise CommandError("queue integrity check FAILED (see the table above)")

    def print_table(self, r: dict[str, Any]) -> None:
        def f(v, unit=""):
            return "-" if v is None else (f"{v:,.1f}{unit}" if isinstance(v, float) else f"{v:,}{unit}")

        rows: list[tuple[str, str]] = []
        if "queue" in r:
            q = r["queue"]
            lat = q["latency_all"]
            rows += [
                ("queue enqueue/s", f(q["enqueue_per_s"])),
                ("queue delivery/s", f(q["delivery_per_s"])),
                ("queue latency p50/p95/p99/max", " / ".join(f(lat[k], " ms") for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms"))),
                ("queue latency first-attempt p99", f(q["latency_first_attempt"]["p99_ms"], " ms")),
                ("queue latency retried p99", f(q["latency_retried"]["p99_ms"], " ms")),
                ("queue integrity", ("OK" if q["integrity"]["ok"] else "FAILED") + " " + json.dumps(
                    {k: v for k, v in q["integrity"].items() if k not in ("ok", "shards")})),
                ("queue shards after", json.dumps(q["integrity"]["shards"])),
            ]
            if q["errors_sample"]:
                rows.append(("queue enqueue errors (first)", q["errors_sample"][0][:160]))
        if "events" in r:
            e = r["events"]
            rows += [
                ("events RPCs/s", f(e["rpcs_per_s"])),
                ("events runs/s", f(e["runs_per_s"])),
                ("events applyEvent p50/p99", f"{f(e['apply_event']['p50_ms'], ' ms')} / {f(e['apply_event']['p99_ms'], ' ms')}"),
                ("events other RPC p50/p99", f"{f(e['other_rpc']['p50_ms'], ' ms')} / {f(e['other_rpc']['p99_ms'], ' ms')}"),
            ]
        if "listing" in r:
            for variant, pages in r["listing"]["pages"].items():
                for where, s in pages.items():
                    rows.append((f"listing {variant} {where} page p50/p99",
                                 f"{f(s['p50_ms'], ' ms')} / {f(s['p99_ms'], ' ms')}"))
            rows.append((f"listing population write/s ({r['listing']['populated_with']})", f(r["listing"]["populate_per_s"])))
        if "streams" in r:
            s = r["streams"]
            rows += [
                ("streams writes/s (1 writer)", f(s["writes_per_s"])),
                ("streams chunk reads/s", f(s["chunk_reads_per_s"])),
                ("streams first / last page", f"{f(s['first_page']['p50_ms'], ' ms')} / {f(s['last_page']['p50_ms'], ' ms')}"),
            ]
        width = max(len(k) for k, _ in rows) if rows else 10
        self.stdout.write("")
        self.stdout.write(f"worldcell benchmark  {r['url']}  {r['label']}  ({r['machine']['cpus']} cpus)")
        for k, v in rows:
            self.stdout.write(f"  {k.ljust(width)}  {v}")
        self.stdout.write("")

    # ------------------------------------------------------------------ queue

    def bench_queue(self, o) -> dict[str, Any]:
        n, shards = o["messages"], o["shards"]
        sink = Sink()
        pad = "x" * max(0, o["body_bytes"] - 60)
        enqueued_at: dict[int, float] = {}
        accepted = 0
        errors: list[str] = []
        queue_name = f"__wkf_step_bench{self.tag}"

        def enqueue(i: int) -> bool:
            body = json.dumps({"seq": i, "tag": self.tag, "pad": pad})
            enqueued_at[i] = time.time()
            try:
                out = self.world.enqueue(queue_name, body, target_base_url=sink.url, shards=shards,
                                         idempotency_key=f"bench-{self.tag}-{i}")
            except (RpcCallError, httpx.HTTPError) as exc:
                errors.append(str(exc))
                return False
            if not out.get("ok"):
                errors.append(f"{out.get('code')}: {out.get('message')}")
            return bool(out.get("ok"))

        # Messages and dead letters already in the shards are not this run's: count differences.
        before = [self.world.call("queue", f"q:{s}", "stats") for s in range(shards)]
        dead_before = sum(s["deadLetters"] for s in before)
        left_before = sum(s["pending"] + s["inflight"] for s in before)
        try:
            t0 = time.time()
            elapsed, oks = run_parallel(n, o["clients"], enqueue)
            accepted = sum(oks)
            deadline = time.monotonic() + o["drain_timeout"]
            while time.monotonic() < deadline:
                with sink.lock:
                    done = len(sink.successes)
                if done >= accepted:
                    break
                time.sleep(0.02)
            with sink.lock:
                successes = {k: list(v) for k, v in sink.successes.items()}
                retried = set(sink.answered_503)
            time.sleep(0.5)  # let the fleet apply the last acks before reading stats
            shard_stats = {f"q:{s}": self.world.call("queue", f"q:{s}", "stats") for s in range(shards)}
        finally:
            sink.close()
        last = max((v[0] for v in successes.values()), default=t0)
        lat_all = [successes[i][0] - enqueued_at[i] for i in successes]
        lat_first = [successes[i][0] - enqueued_at[i] for i in successes if i not in retried]
        lat_retried = [successes[i][0] - enqueued_at[i] for i in successes if i in retried]
        missing = accepted - len(successes)
        dup = sum(len(v) - 1 for v in successes.values())
        dead = sum(s["deadLetters"] for s in shard_stats.values()) - dead_before
        leftover = sum(s["pending"] + s["inflight"] for s in shard_stats.values()) - left_before
        integrity = {
            "ok": missing == 0 and dup == 0 and dead == 0 and leftover == 0 and accepted == n,
            "accepted": accepted, "delivered": len(successes), "missing": missing,
            "duplicate_successes": dup, "dead_letters": dead, "enqueue_errors": len(errors),
            "shards": {k: {"pending": v["pending"], "inflight": v["inflight"]} for k, v in shard_stats.items()},
        }
        return {
            "messages": n, "clients": o["clients"], "shards": shards,
            "enqueue_per_s": accepted / elapsed if elapsed else None,
            "delivery_per_s": len(successes) / (last - t0) if last > t0 else None,
            "latency_all": summary_ms(lat_all),
            "latency_first_attempt": summary_ms(lat_first),
            "latency_retried": summary_ms(lat_retried),
            "integrity": integrity,
            "errors_sample": errors[:5],
        }

    # ------------------------------------------------------------------ events

    def bench_events(self, o) -> dict[str, Any]:
        apply_times: list[float] = []
        other_times: list[float] = []
        lock = threading.Lock()
        rpc_count = [0]
        steps = o["steps"]

        class Timed(WorldClient):
            def call(inner, binding, name, method, *args):  # noqa: N805
                t = time.perf_counter()
                try:
                    return WorldClient.call(inner, binding, name, method, *args)
                finally:
                    d = time.perf_counter() - t
                    with lock:
                        rpc_count[0] += 1
                        (apply_times if method == "applyEvent" else other_times).append(d)

        world = Timed(self.world.base_url, "", http=self.http)
        world.headers = self.world.headers

        def lifecycle(i: int) -> bool:
            run_id = f"wrun_bench{self.tag}{i:06d}"
            wf = f"bench-events-{self.tag}"
            seq = [
                {"eventType": "run_created", "specVersion": 3,
                 "eventData": {"deploymentId": "bench", "workflowName": wf, "input": b"x" * 64}},
                {"eventType": "run_started"},
            ]
            for s in range(steps):
                sid = f"step_{s}"
                seq += [
                    {"eventType": "step_created", "correlationId": sid, "eventData": {"stepName": f"s{s}", "input": b"in"}},
                    {"eventType": "step_started", "correlationId": sid},
                    {"eventType": "step_completed", "correlationId": sid, "eventData": {"result": b"out"}},
                ]
            seq.append({"eventType": "run_completed", "eventData": {"output": b"done"}})
            for data in seq:
                if not world.apply_event(run_id, data).get("ok"):
                    return False
            return True

        elapsed, oks = run_parallel(o["runs"], o["event_clients"], lifecycle)
        return {
            "runs": o["runs"], "clients": o["event_clients"], "steps_per_run": steps,
            "failed_runs": oks.count(False),
            "rpcs": rpc_count[0], "seconds": elapsed,
            "rpcs_per_s": rpc_count[0] / elapsed, "runs_per_s": o["runs"] / elapsed,
            "apply_event": summary_ms(apply_times), "other_rpc": summary_ms(other_times),
        }

    # ------------------------------------------------------------------ listing

    def bench_listing(self, o) -> dict[str, Any]:
        population = o["population"]
        wf = f"bench-list-{self.tag}"
        base_ms = int(time.time() * 1000) - population
        keys_wf = [f"run:{wf}:{ms13(base_ms + i)}:wrun_l{self.tag}{i:07d}" for i in range(population)]

        def put(i: int) -> None:
            meta = json.dumps({"runId": f"wrun_l{self.tag}{i:07d}", "createdAt": "2026-01-01T00:00:00.000Z", "status": "completed"})
            created = ms13(base_ms + i)
            self.world.call("index", "index", "put", keys_wf[i], meta)
            self.world.call("index", "index", "put", f"runall:{created}:wrun_l{self.tag}{i:07d}", meta)

        if o["bulk_direct"]:
            elapsed = self.bulk_populate(keys_wf, base_ms)
        else:
            elapsed, _ = run_parallel(population, o["clients"], put)
        # The client lists with limit max(50, pageLimit) and keeps pageLimit + 1 entries.
        page_limit, fetch_limit = 20, 50

        def time_page(prefix: str, cursor: str | None) -> float:
            t = time.perf_counter()
            opts: dict[str, Any] = {"prefix": prefix, "limit": fetch_limit}
            if cursor:
                opts["cursor"] = cursor
            res = self.world.call("index", "index", "list", opts)
            assert len(res["keys"]) >= min(page_limit, 1)
            return time.perf_counter() - t

        out: dict[str, dict[str, Any]] = {}
        mid = population // 2
        last = max(0, population - page_limit - 1)
        # runall: keys sort by ms13 time then run id, exactly like keys_wf's suffix
        all_prefix = "runall:"
        all_cursor = {"first": None, "middle": f"runall:{ms13(base_ms + mid)}:", "last": f"runall:{ms13(base_ms + last)}:"}
        wf_cursor = {"first": None, "middle": keys_wf[mid], "last": keys_wf[last]}
        for variant, prefix, cursors in (("workflowName", f"run:{wf}:", wf_cursor), ("all", all_prefix, all_cursor)):
            out[variant] = {}
            for where, cursor in cursors.items():
                samples = [time_page(prefix, cursor) for _ in range(o["list_samples"])]
                out[variant][where] = summary_ms(samples)
        return {"population": population, "populate_seconds": elapsed,
                "populate_per_s": 2 * population / elapsed,
                "populated_with": "bulk INSERT" if o["bulk_direct"] else "index.put RPCs", "pages": out}

    def bulk_populate(self, keys_wf: list[str], base_ms: int) -> float:
        """Insert the listing population (``run:`` and ``runall:`` keys) with bulk INSERTs; returns seconds."""
        from cells.models import IndexEntry
        from worldcell import codec

        started = time.perf_counter()
        rows = []
        for i, key in enumerate(keys_wf):
            run_id = key.rsplit(":", 1)[1]
            meta = codec.encode(json.dumps({"runId": run_id, "createdAt": "2026-01-01T00:00:00.000Z", "status": "completed"}))
            rows.append(IndexEntry(cell="index", key=key, value=meta))
            rows.append(IndexEntry(cell="index", key=f"runall:{ms13(base_ms + i)}:{run_id}", value=meta))
            if len(rows) >= 10_000:
                IndexEntry.objects.bulk_create(rows, batch_size=5_000)
                rows = []
        if rows:
            IndexEntry.objects.bulk_create(rows, batch_size=5_000)
        return time.perf_counter() - started

    # ------------------------------------------------------------------ streams

    def bench_streams(self, o) -> dict[str, Any]:
        k = o["chunks"]
        name = f"bench-{self.tag}"
        chunk = os.urandom(o["chunk_bytes"])
        self.world.call("streams", f"run-streams:wrun_s{self.tag}", "registerStream", name)
        t = time.perf_counter()
        for _ in range(k):
            self.world.call("streams", f"stream:{name}", "writeChunk", chunk)
        write_s = time.perf_counter() - t
        self.world.call("streams", f"stream:{name}", "closeStream")
        page_times: list[float] = []
        read = 0
        t = time.perf_counter()
        while True:
            p = time.perf_counter()
            res = self.world.call("streams", f"stream:{name}", "getChunks", {"startIndex": read, "limit": 32})
            page_times.append(time.perf_counter() - p)
            if not res["chunks"]:
                break
            assert res["chunks"][0] == chunk
            read += len(res["chunks"])
        read_s = time.perf_counter() - t
        if read != k:
            raise CommandError(f"stream read back {read} chunks, expected {k}")

        def sample(start: int) -> dict[str, Any]:
            times = []
            for _ in range(30):
                p = time.perf_counter()
                self.world.call("streams", f"stream:{name}", "getChunks", {"startIndex": start, "limit": 32})
                times.append(time.perf_counter() - p)
            return summary_ms(times)

        return {
            "chunks": k, "chunk_bytes": o["chunk_bytes"],
            "writes_per_s": k / write_s, "chunk_reads_per_s": k / read_s,
            "page": summary_ms(page_times), "first_page": sample(0), "last_page": sample(max(0, k - 32)),
        }
