#!/usr/bin/env python3
"""Black-box benchmark harness for world-celld v0.1.0 fleet-protocol servers.

Talks to ANY server that speaks the fleet protocol of docs/protocol.md (cited as "spec §N"):
``POST /v1/rpc/{binding}/{name}/{method}`` with ``Authorization: Bearer <secret>`` and a body that is
the tagged-JSON encoding of the positional argument array (Dates as ``{"__type":"Date","iso":…}``,
bytes as ``{"__type":"Uint8Array","data":<base64>}``).  Standard library only (Python 3.11).

Workloads
---------
queue    Mirror of the upstream perf test (test/perf/minio.test.ts): N messages enqueued by C threads
         over S queue cells (``q:b<tag>-<i>``, shard = FNV-1a(messageId) like the real client), body of
         exactly --payload-bytes, delivered to a sink HTTP server started by this script; every
         --retry-every-th message is answered once with ``503 {"timeoutSeconds":0}``.  Measures
         enqueue/s, delivery/s, enqueue RPC latency, delivery latency (enqueue start -> successful
         delivery received) for all / first-attempt / retried messages, and integrity (missing,
         duplicate successes, dead letters, final pending/inflight per cell).
events   R runs, each run_created, run_started, S x (step_created, step_started, step_completed),
         run_completed, with the index puts the real client makes (run:/runall: after outcomes with a
         run, correlation: after outcomes whose event has a correlationId).  C threads, each owning
         whole runs.  Verifies every run afterwards (getRun, listEvents, run: index entries).
streams  One stream of K chunks written by 1 thread, another by 8 threads (dense unique indexes are
         checked), each then read back with getChunks pages of 32 and compared byte for byte.

Every phase reports the client's own CPU (getrusage; the sink server runs inside this process, so its
CPU is included), machine-wide busy % and hypervisor steal from /proc/stat, and -- with --server-pid --
the server's CPU % (average and peak over --cpu-interval windows) plus "other" CPU (machine busy minus
client minus server: other tenants, kernel softirq).  A run whose "other" exceeds --other-threshold %
of a core is flagged as contaminated.  Each worker thread keeps one persistent http.client connection;
to keep the client's CPU per RPC low, http.client's email-based header parser is replaced by a small
compatible one and each request goes out in a single write (--stock-http restores stock behaviour).
--warmup runs every workload once at 1/10 size first (a freshly started node reference is ~40% slower
on its first run).

Exit status: 0 = all integrity checks passed; 1 = an integrity check failed (queue: missing,
duplicate success or dead-lettered message, enqueue errors, ...; events/streams: RPC errors or
verification failures); 2 = setup error (server unreachable, bad secret, bad arguments).

Example
-------
    python3 bench.py --url http://127.0.0.1:18811 --secret s3cret --workload all \
        --repeat 3 --server-pid 12345 --json out.json
"""

from __future__ import annotations

import argparse
import base64
import calendar
import datetime as _dt
import http.client
import http.server
import json
import math
import os
import platform
import random
import resource
import socket
import statistics
import sys
import threading
import time
import urllib.parse

BENCH_VERSION = "1.0"
UTC = _dt.timezone.utc
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=UTC)

# Methods the reference client sends exactly once (spec §2.10); everything else may be retried.
MUTATING = {
    ("runs", "applyEvent"),
    ("streams", "writeChunk"), ("streams", "closeStream"), ("streams", "registerStream"),
    ("queue", "enqueue"), ("queue", "redriveDeadLetter"), ("queue", "purgeDeadLetters"),
    ("queue", "rearmAlarm"),
    ("index", "put"), ("index", "delete"), ("index", "reserveHookToken"),
    ("index", "finalizeHookIndexes"), ("index", "releaseHookToken"), ("index", "deleteHookIndexes"),
}


# ============================================================================ small helpers

def perf() -> float:
    return time.perf_counter()


def ms13(ms: int) -> str:
    return str(max(0, int(ms))).rjust(13, "0")


def iso_from_ms(ms: int) -> str:
    secs, rem = divmod(int(ms), 1000)
    dt = EPOCH + _dt.timedelta(seconds=secs)
    return f"{dt:%Y-%m-%dT%H:%M:%S}.{rem:03d}Z"


def parse_iso_ms(text: str) -> int:
    t = text.strip()
    if t[-1:] in ("Z", "z"):
        t = t[:-1] + "+00:00"
    dt = _dt.datetime.fromisoformat(t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return calendar.timegm(dt.utctimetuple()) * 1000 + dt.microsecond // 1000


def encode_uri_component(s: str) -> str:
    """JavaScript encodeURIComponent (unreserved: A-Z a-z 0-9 - _ . ! ~ * ' ( ))."""
    return urllib.parse.quote(s, safe="-_.!~*'()")


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid() -> str:
    """A ULID-shaped id (10 time chars + 16 random chars, Crockford base32)."""
    t = int(time.time() * 1000)
    r = int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(16):
        out.append(_CROCKFORD[r & 31])
        r >>= 5
    for _ in range(10):
        out.append(_CROCKFORD[t & 31])
        t >>= 5
    return "".join(reversed(out))


def fnv1a_shard(key: str, shards: int) -> int:
    """Shard selection of the reference client (spec §7.11): FNV-1a over UTF-16 code units."""
    if shards <= 1:
        return 0
    h = 0x811C9DC5
    data = key.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h % shards


def summarize(values) -> dict:
    """Nearest-rank percentiles (the upstream perf test's definition), in the unit given."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    s = sorted(values)
    n = len(s)

    def at(q: float) -> float:
        return round(s[max(0, math.ceil(q * n) - 1)], 3)

    return {"count": n, "p50": at(0.50), "p95": at(0.95), "p99": at(0.99),
            "max": round(s[-1], 3), "mean": round(statistics.fmean(s), 3)}


def rate(count: int, seconds: float) -> float:
    return round(count / max(seconds, 1e-6), 2)


def fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def fmt_lat(s: dict) -> str:
    if not s or not s.get("count"):
        return "n=0"
    return (f"p50 {fmt(s['p50'], 2):>8}  p95 {fmt(s['p95'], 2):>8}  p99 {fmt(s['p99'], 2):>8}  "
            f"max {fmt(s['max'], 2):>8}  n={s['count']}")


class Counter:
    """Thread-safe work dispenser."""

    def __init__(self, limit: int):
        self.limit = limit
        self._next = 0
        self._lock = threading.Lock()

    def take(self):
        with self._lock:
            if self._next >= self.limit:
                return None
            i = self._next
            self._next += 1
            return i


class ErrorLog:
    """Counts errors by kind and keeps a few samples."""

    def __init__(self, keep: int = 8):
        self.lock = threading.Lock()
        self.count = 0
        self.by_kind: dict[str, int] = {}
        self.samples: list[str] = []
        self.keep = keep

    def add(self, kind: str, detail: str = ""):
        with self.lock:
            self.count += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if len(self.samples) < self.keep:
                self.samples.append(f"{kind}: {detail}"[:300])

    def as_dict(self) -> dict:
        return {"count": self.count, "byKind": dict(self.by_kind), "samples": list(self.samples)}


# ============================================================================ wire codec

class JsDate:
    """A millisecond instant (what the codec's Date tag carries)."""
    __slots__ = ("ms",)

    def __init__(self, ms: int):
        self.ms = int(ms)

    def iso(self) -> str:
        return iso_from_ms(self.ms)

    def __repr__(self):
        return f"JsDate({self.iso()})"


def _b64decode_lenient(s: str) -> bytes:
    t = "".join(s.split())
    t += "=" * (-len(t) % 4)
    return base64.b64decode(t)


def to_wire(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"__type": "Uint8Array", "data": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, JsDate):
        return {"__type": "Date", "iso": v.iso()}
    if isinstance(v, _dt.datetime):
        ms = calendar.timegm(v.utctimetuple()) * 1000 + v.microsecond // 1000
        return {"__type": "Date", "iso": iso_from_ms(ms)}
    if isinstance(v, dict):
        return {k: to_wire(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_wire(x) for x in v]
    return v


def from_wire(v):
    if isinstance(v, dict):
        t = v.get("__type")
        if t == "Date" and isinstance(v.get("iso"), str):
            try:
                return JsDate(parse_iso_ms(v["iso"]))
            except ValueError:
                return v
        if t == "Uint8Array" and isinstance(v.get("data"), str):
            return _b64decode_lenient(v["data"])
        return {k: from_wire(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_wire(x) for x in v]
    return v


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


# ============================================================================ lean http.client
#
# http.client parses every response header block with the email package, which costs roughly a
# third of the client's CPU per RPC on a small machine.  FastHeaders is a drop-in for the few
# Message methods http.client and http.server use (get, get_all, items, ...); it is installed into
# http.client (and thereby http.server, which calls http.client.parse_headers) by main() unless
# --stock-http is given.  _LeanHTTPConnection sends request line + headers + body in one write.

class FastHeaders:
    __slots__ = ("_items", "_d")

    def __init__(self, items):
        self._items = items
        d = {}
        for k, v in items:
            d.setdefault(k.lower(), v)
        self._d = d

    def get(self, name, failobj=None):
        return self._d.get(name.lower(), failobj)

    def get_all(self, name, failobj=None):
        n = name.lower()
        vals = [v for k, v in self._items if k.lower() == n]
        return vals or failobj

    def __getitem__(self, name):
        return self._d.get(name.lower())

    def __contains__(self, name):
        return name.lower() in self._d

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def keys(self):
        return [k for k, _ in self._items]

    def values(self):
        return [v for _, v in self._items]

    def items(self):
        return list(self._items)

    def get_content_type(self):
        return (self.get("content-type") or "text/plain").split(";")[0].strip().lower()

    def __str__(self):
        return "".join(f"{k}: {v}\r\n" for k, v in self._items) + "\r\n"

    as_string = __str__


def fast_parse_headers(fp, _class=None):
    items = []
    while True:
        line = fp.readline(http.client._MAXLINE + 1)
        if len(line) > http.client._MAXLINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            break
        if len(items) >= http.client._MAXHEADERS:
            raise http.client.HTTPException(f"got more than {http.client._MAXHEADERS} headers")
        k, sep, v = line.decode("iso-8859-1").partition(":")
        if sep:
            items.append((k.strip(), v.strip()))
    return FastHeaders(items)


def install_fast_headers():
    http.client.parse_headers = fast_parse_headers


class _LeanHTTPConnection(http.client.HTTPConnection):
    def _send_output(self, message_body=None, encode_chunked=False):
        if isinstance(message_body, bytes) and not encode_chunked:
            self._buffer.extend((b"", b""))
            msg = b"\r\n".join(self._buffer) + message_body
            del self._buffer[:]
            self.send(msg)
        else:
            super()._send_output(message_body, encode_chunked)


# ============================================================================ RPC client

class RpcError(Exception):
    def __init__(self, kind: str, status, name: str, message: str):
        super().__init__(f"{kind} {status} {name}: {message}")
        self.kind, self.status, self.name, self.message = kind, status, name, message

    def short(self) -> str:
        st = "" if self.status is None else f" {self.status}"
        return f"{self.kind}{st} {self.name}: {self.message[:160]}"


class RpcClient:
    """One persistent HTTP/1.1 connection (use one per thread)."""

    def __init__(self, base_url: str, secret: str, timeout: float = 30.0, idle_reconnect_s: float = 2.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base_url!r}")
        self.conn_cls = http.client.HTTPSConnection if u.scheme == "https" else _LeanHTTPConnection
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}
        self.timeout = timeout
        self.idle_reconnect_s = idle_reconnect_s
        self.conn = None
        self.last = 0.0
        self.connects = 0

    def connect(self):
        self.close()
        c = self.conn_cls(self.host, self.port, timeout=self.timeout)
        c.connect()
        self.conn = c
        self.connects += 1
        self.last = perf()

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    def path(self, binding: str, name: str, method: str) -> str:
        return f"{self.prefix}/v1/rpc/{binding}/{encode_uri_component(name)}/{method}"

    def call(self, binding: str, name: str, method: str, args: list):
        path = self.path(binding, name, method)
        body = json.dumps(to_wire(args), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        safe = (binding, method) not in MUTATING
        tries = 3 if safe else 1
        status, data = None, b""
        for attempt in range(tries):
            # Servers close idle keep-alive connections (node: 5 s); a mutating call must never be
            # resent, so refresh a connection that sat idle instead of risking a dead socket.
            if self.conn is None or perf() - self.last > self.idle_reconnect_s:
                try:
                    self.connect()
                except OSError as e:
                    if attempt + 1 < tries:
                        time.sleep(0.1 * (attempt + 1))
                        continue
                    raise RpcError("transport", None, type(e).__name__, str(e)) from None
            try:
                self.conn.request("POST", path, body, self.headers)
                resp = self.conn.getresponse()
                data = resp.read()
                status = resp.status
                if resp.will_close:
                    self.close()
                self.last = perf()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt + 1 < tries:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise RpcError("transport", None, type(e).__name__, str(e)) from None
            if status in (502, 503, 504) and attempt + 1 < tries:
                time.sleep(0.1 * (attempt + 1))
                continue
            break
        if status != 200:
            name, message = f"HTTP{status}", data[:300].decode("utf-8", "replace")
            try:
                err = json.loads(data).get("error") or {}
                name = str(err.get("name", name))
                message = str(err.get("message", message))
            except Exception:
                pass
            raise RpcError("http", status, name, message)
        try:
            value = json.loads(data, parse_constant=_reject_constant)
        except ValueError as e:
            raise RpcError("decode", status, "BadJSON", f"{e}: {data[:120]!r}") from None
        if b'"__type"' in data:
            value = from_wire(value)
        return value


def start_barrier_workers(n: int, target, name: str):
    """Start n threads running target(worker_index, barrier); returns (threads, barrier).

    Each worker prepares (connects) and then waits on the barrier; the caller also waits on it and
    takes the start timestamp right after, so connection set-up is not part of the measurement.
    """
    barrier = threading.Barrier(n + 1)
    threads = [threading.Thread(target=target, args=(i, barrier), name=f"{name}-{i}", daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    return threads, barrier


def safe_wait(barrier: threading.Barrier):
    try:
        barrier.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass


# ============================================================================ CPU accounting

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
NCPU = os.cpu_count() or 1


def _proc_stat_fields(pid: int):
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read().decode("ascii", "replace")
    return raw[raw.rindex(")") + 2:].split()  # fields from #3 (state) on


def proc_cpu_s(pid: int):
    try:
        f = _proc_stat_fields(pid)
        return (int(f[11]) + int(f[12])) / CLK_TCK  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def proc_descendants(roots) -> set:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set(roots)
    for e in entries:
        if not e.isdigit():
            continue
        try:
            ppid = int(_proc_stat_fields(int(e))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, stack = set(), list(roots)
    while stack:
        p = stack.pop()
        if p in out:
            continue
        out.add(p)
        stack.extend(children.get(p, ()))
    return out


def machine_cpu():
    """{'cpu': (busy, total, steal), 'cpu0': ...} in clock ticks from /proc/stat."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                parts = line.split()
                vals = [int(x) for x in parts[1:]]
                idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
                total = sum(vals[:8])
                out[parts[0]] = (total - idle, total, vals[7] if len(vals) > 7 else 0)
    except OSError:
        pass
    return out


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuMeter:
    """Measures one phase: client CPU, server CPU (avg + peak over --cpu-interval windows), machine."""

    def __init__(self, server_pids, tree: bool, interval: float = 0.25):
        self.roots = list(server_pids or [])
        self.tree = tree
        self.interval = interval
        self._stop = threading.Event()
        self._samples: list[tuple[float, float]] = []
        self._thread = None

    def _pids(self):
        return proc_descendants(self.roots) if self.tree else set(self.roots)

    def _server_snapshot(self):
        vals = {}
        for p in self.pids:
            v = proc_cpu_s(p)
            if v is not None:
                vals[p] = v
        return vals

    @staticmethod
    def _delta(a: dict, b: dict) -> float:
        return sum(max(0.0, b[p] - a[p]) for p in a if p in b)

    def start(self):
        self.pids = self._pids() if self.roots else set()
        self.t0 = perf()
        self.c0 = client_cpu_s()
        self.m0 = machine_cpu()
        self.s0 = self._server_snapshot() if self.pids else {}
        if self.pids:
            self._thread = threading.Thread(target=self._sample, name="cpu-sampler", daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        prev_t, prev = perf(), self._server_snapshot()
        self._last = (prev_t, prev)
        while not self._stop.wait(self.interval):
            t, cur = perf(), self._server_snapshot()
            if t - prev_t > 0:
                self._samples.append((t, 100.0 * self._delta(prev, cur) / (t - prev_t)))
            prev_t, prev = t, cur
            self._last = (prev_t, prev)

    def stop(self) -> dict:
        t1 = perf()
        c1 = client_cpu_s()
        m1 = machine_cpu()
        s1 = self._server_snapshot() if self.pids else {}
        self._stop.set()
        if self._thread:
            self._thread.join()
        wall = max(t1 - self.t0, 1e-9)
        client_s = c1 - self.c0
        out = {
            "wallS": round(wall, 3),
            "clientCpuS": round(client_s, 3),
            "clientCpuPctOfCore": round(100.0 * client_s / wall, 1),
            "clientCpuPctOfMachine": round(100.0 * client_s / wall / NCPU, 1),
        }
        busy = {}
        for k, (b1, tot1, st1) in m1.items():
            if k in self.m0:
                b0, tot0, st0 = self.m0[k]
                if tot1 - tot0 > 0:
                    busy[k] = round(100.0 * (b1 - b0) / (tot1 - tot0), 1)
                    if k == "cpu":
                        # hypervisor steal (VMs): CPU time the guest wanted but did not get
                        out["stealPct"] = round(100.0 * (st1 - st0) / (tot1 - tot0), 1)
        out["machineBusyPct"] = busy.get("cpu")
        out["perCpuBusyPct"] = {k: v for k, v in busy.items() if k != "cpu"}
        if self.pids:
            server_s = self._delta(self.s0, s1)
            peaks = [v for _, v in self._samples]
            last = getattr(self, "_last", None)
            if last is not None and t1 - last[0] >= self.interval / 2:   # the tail window
                peaks.append(100.0 * self._delta(last[1], s1) / (t1 - last[0]))
            out["serverPids"] = sorted(self.pids)
            out["serverCpuS"] = round(server_s, 3)
            out["serverCpuPctAvg"] = round(100.0 * server_s / wall, 1)
            out["serverCpuPctPeak"] = round(max(peaks + [out["serverCpuPctAvg"]]), 1)
            if out["machineBusyPct"] is not None:
                # CPU burnt by neither this client nor the server (other tenants, kernel softirq, ...),
                # in % of one core; a large value means the figures are contaminated.
                other = out["machineBusyPct"] * NCPU - out["clientCpuPctOfCore"] - out["serverCpuPctAvg"]
                out["otherCpuPctOfCore"] = round(max(0.0, other), 1)
        return out


def machine_idle_check(seconds: float = 1.0) -> dict:
    """Machine-wide busy % over a short window before the benchmark starts."""
    m0 = machine_cpu()
    time.sleep(seconds)
    m1 = machine_cpu()
    out = {}
    for k, (b1, t1, _) in m1.items():
        if k in m0 and t1 - m0[k][1] > 0:
            out[k] = round(100.0 * (b1 - m0[k][0]) / (t1 - m0[k][1]), 1)
    return out


def fmt_cpu(c: dict) -> str:
    s = (f"client {c['clientCpuS']:.2f}s = {c['clientCpuPctOfCore']:.0f}% of one core "
         f"({c['clientCpuPctOfMachine']:.0f}% of the {NCPU}-cpu machine)")
    if "serverCpuPctAvg" in c:
        s += f"; server avg {c['serverCpuPctAvg']:.0f}% peak {c['serverCpuPctPeak']:.0f}%"
    if c.get("machineBusyPct") is not None:
        per = " ".join(f"{k}={v:.0f}%" for k, v in sorted(c.get("perCpuBusyPct", {}).items()))
        s += f"; machine busy {c['machineBusyPct']:.0f}% ({per})"
    if c.get("otherCpuPctOfCore") is not None:
        s += f"; other {c['otherCpuPctOfCore']:.0f}%"
    if c.get("stealPct"):
        s += f"; steal {c['stealPct']:.0f}%"
    if c.get("clientCpuUsPerRpc") is not None:
        s += f"; client {c['clientCpuUsPerRpc']:.0f} us CPU/RPC"
    return s


def add_per_rpc(c: dict, rpcs: int) -> dict:
    if rpcs > 0:
        c["clientCpuUsPerRpc"] = round(c["clientCpuS"] * 1e6 / rpcs, 1)
    return c


# ============================================================================ queue sink

class QueueRunState:
    """Book-keeping for one queue workload run; the sink routes deliveries here by perfRunId."""

    def __init__(self, perf_run_id: str, n: int, retry_every: int, queue_name: str):
        self.perf_run_id = perf_run_id
        self.n = n
        self.retry_every = retry_every
        self.queue_name = queue_name
        self.lock = threading.Lock()
        self.started = [None] * n        # perf() just before the enqueue RPC
        self.expected_id = [None] * n    # messageId we sent
        self.accepted = [False] * n
        self.callbacks = [0] * n         # deliveries received (any answer)
        self.success = {}                # seq -> (latency_ms, callbacks_at_success, t)
        self.success_count = 0
        self.dup_success = 0
        self.n503 = 0
        self.mismatched_ids = 0
        self.bad_path = 0
        self.bad_queue_name = 0
        self.attempt_headers: dict[str, int] = {}
        self.success_attempt_not_1 = 0
        self.invalid = ErrorLog()
        self.first_success_t = None
        self.last_success_t = None
        self.last_callback_t = None

    def on_delivery(self, seq: int, path: str, headers, t: float):
        if not (isinstance(seq, int) and 0 <= seq < self.n):
            self.invalid.add("bad-sequence", repr(seq))
            return 400, b'{"error":"bad sequence"}'
        msg_id = headers.get("x-vqs-message-id")
        attempt_hdr = headers.get("x-vqs-message-attempt")
        qn = headers.get("x-vqs-queue-name")
        with self.lock:
            self.last_callback_t = t
            self.callbacks[seq] += 1
            calls = self.callbacks[seq]
            self.attempt_headers[str(attempt_hdr)] = self.attempt_headers.get(str(attempt_hdr), 0) + 1
            if path != "/.well-known/workflow/v1/step":
                self.bad_path += 1
            if qn != self.queue_name:
                self.bad_queue_name += 1
            if msg_id is None or msg_id != self.expected_id[seq]:
                self.mismatched_ids += 1
                self.invalid.add("message-id", f"seq {seq}: got {msg_id!r} expected {self.expected_id[seq]!r}")
            if self.retry_every > 0 and seq % self.retry_every == 0 and calls == 1:
                self.n503 += 1
                return 503, b'{"timeoutSeconds":0}'
            start = self.started[seq]
            if start is None:
                self.invalid.add("unknown-start", f"seq {seq}")
                return 400, b'{"error":"unknown sequence"}'
            if seq in self.success:
                self.dup_success += 1
            else:
                self.success[seq] = ((t - start) * 1000.0, calls, t)
                self.success_count += 1
                if attempt_hdr != "1":
                    self.success_attempt_not_1 += 1
                if self.first_success_t is None or t < self.first_success_t:
                    self.first_success_t = t
                if self.last_success_t is None or t > self.last_success_t:
                    self.last_success_t = t
        return 200, b'{"ok":true}'


class _SinkHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"      # keep-alive, like a real app server
    disable_nagle_algorithm = True
    server_version = "bench-sink"
    sys_version = ""

    def log_message(self, *args):
        pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        raw = self._read_body()
        t = perf()
        sink: Sink = self.server.sink  # type: ignore[attr-defined]
        try:
            payload = json.loads(raw)
            run_id = payload.get("perfRunId")
            seq = payload.get("sequence")
        except Exception as e:  # noqa: BLE001
            sink.unexpected.add("malformed-body", f"{e}: {raw[:80]!r}")
            self._answer(400, b'{"error":"malformed body"}')
            return
        state = sink.routes.get(run_id)
        if state is None:
            sink.unexpected.add("unknown-perfRunId", str(run_id))
            self._answer(400, b'{"error":"unknown perfRunId"}')
            return
        status, body = state.on_delivery(seq, self.path, self.headers, t)
        self._answer(status, body)

    def do_GET(self):
        self._answer(200, b'{"ok":true,"sink":true}')


class Sink:
    """The application stand-in the queue cells deliver to (one per bench process)."""

    def __init__(self, host: str, port: int):
        self.routes: dict[str, QueueRunState] = {}
        self.unexpected = ErrorLog()
        self.httpd = _SinkHTTPServer((host, port), _SinkHandler)
        self.httpd.sink = self  # type: ignore[attr-defined]
        self.host, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="sink", daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ============================================================================ workload: queue

def queue_cells(tag: str, shards: int):
    return [f"q:b{tag}-{i}" for i in range(shards)]


def make_queue_body(perf_run_id: str, seq: int, size: int) -> str:
    """Shared-codec JSON of {perfRunId, sequence, padding} padded to exactly `size` bytes if possible."""
    base = json.dumps({"perfRunId": perf_run_id, "sequence": seq, "padding": ""}, separators=(",", ":"))
    pad = max(0, size - len(base.encode("utf-8")))
    return json.dumps({"perfRunId": perf_run_id, "sequence": seq, "padding": "x" * pad}, separators=(",", ":"))


def poll_stats(rpc: RpcClient, cells):
    out = {}
    for c in cells:
        out[c] = rpc.call("queue", c, "stats", [])
    return out


def run_queue(args, tag: str, sink: Sink, server_pids) -> dict:
    n, conc, shards = args.messages, args.concurrency, args.shards
    perf_run_id = f"bench-{tag}"
    cells = queue_cells(tag, shards)
    state = QueueRunState(perf_run_id, n, args.retry_every, args.queue_name)
    sink.routes[perf_run_id] = state
    target = args.target_base_url or f"http://{sink.host}:{sink.port}"
    bodies = [make_queue_body(perf_run_id, i, args.payload_bytes) for i in range(n)]
    work = Counter(n)
    enqueue_lat: list[float] = []
    lat_lock = threading.Lock()
    errors = ErrorLog()
    rpc_counts = {"enqueue": 0}

    def worker(idx, barrier):
        rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
        try:
            rpc.connect()
        except OSError as e:
            errors.add("connect", str(e))
        safe_wait(barrier)
        local = []
        while True:
            seq = work.take()
            if seq is None:
                break
            msg_id = "msg_" + ulid()
            cell = cells[fnv1a_shard(msg_id, shards)]
            req = {"messageId": msg_id, "queueName": args.queue_name, "pathname": "step",
                   "body": bodies[seq], "config": {"targetBaseUrl": target, "queueShards": shards}}
            state.expected_id[seq] = msg_id
            t0 = perf()
            state.started[seq] = t0
            try:
                out = rpc.call("queue", cell, "enqueue", [req])
            except RpcError as e:
                errors.add("enqueue-" + e.kind, e.short())
                continue
            t1 = perf()
            if isinstance(out, dict) and out.get("ok") is True and out.get("messageId") == msg_id \
                    and out.get("deduped") is False:
                state.accepted[seq] = True
                local.append((t1 - t0) * 1000.0)
            else:
                errors.add("enqueue-outcome", json.dumps(out, default=str)[:200])
        rpc.close()
        with lat_lock:
            enqueue_lat.extend(local)
            rpc_counts["enqueue"] += len(local)

    meter_all = CpuMeter(server_pids, args.server_tree, args.cpu_interval)
    meter_enq = CpuMeter(server_pids, args.server_tree, args.cpu_interval)
    threads, barrier = start_barrier_workers(min(conc, n), worker, "enq")
    meter_all.start()
    meter_enq.start()
    safe_wait(barrier)
    t_start = perf()
    for t in threads:
        t.join()
    t_enq_end = perf()
    cpu_enqueue = meter_enq.stop()
    accepted = sum(state.accepted)
    add_per_rpc(cpu_enqueue, n)
    deadline = t_start + args.timeout

    # wait for every accepted message to be delivered successfully
    def delivered_all():
        with state.lock:
            return all(seq in state.success for seq in range(n) if state.accepted[seq])

    while perf() < deadline and not delivered_all():
        time.sleep(0.01)
    all_delivered = delivered_all()
    t_delivered = perf()

    # then wait for the cells to drain (pending == inflight == 0 everywhere)
    stats_rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
    drained, stats = False, {}
    while True:
        try:
            stats = poll_stats(stats_rpc, cells)
            drained = all(s.get("pending") == 0 and s.get("inflight") == 0 for s in stats.values())
        except RpcError as e:
            errors.add("stats-" + e.kind, e.short())
        if drained or perf() >= deadline:
            break
        time.sleep(0.1)
    t_drained = perf()
    cpu_all = meter_all.stop()
    # late duplicates would show up here
    time.sleep(args.settle)
    try:
        stats = poll_stats(stats_rpc, cells)
    except RpcError as e:
        errors.add("stats-" + e.kind, e.short())
    dead_samples = []
    for c, s in stats.items():
        if s.get("deadLetters"):
            try:
                page = stats_rpc.call("queue", c, "listDeadLetters", [{"limit": 5}])
                for row in page.get("data", [])[:5]:
                    dead_samples.append({"cell": c, "messageId": row.get("messageId"),
                                         "attempt": row.get("attempt"), "lastError": row.get("lastError")})
            except RpcError as e:
                errors.add("dlq-" + e.kind, e.short())
    stats_rpc.close()
    sink.routes.pop(perf_run_id, None)

    with state.lock:
        succ = dict(state.success)
        missing = [s for s in range(n) if state.accepted[s] and s not in succ]
        delivered = sum(1 for s in succ if state.accepted[s])
        lat_all = [v[0] for v in succ.values()]
        lat_first = [v[0] for v in succ.values() if v[1] == 1]
        lat_retried = [v[0] for v in succ.values() if v[1] > 1]
        first_s, last_s = state.first_success_t, state.last_success_t
        callbacks = sum(state.callbacks)

    enqueue_wall = t_enq_end - t_start
    delivery_span = (last_s - t_start) if last_s else None
    dead_letters = sum(int(s.get("deadLetters") or 0) for s in stats.values())
    pending = sum(int(s.get("pending") or 0) for s in stats.values())
    inflight = sum(int(s.get("inflight") or 0) for s in stats.values())
    integrity = {
        "messages": n,
        "accepted": accepted,
        "enqueueErrors": errors.count,
        "delivered": delivered,
        "missing": len(missing),
        "missingSample": missing[:20],
        "duplicateSuccesses": state.dup_success,
        "deadLetters": dead_letters,
        "deadLetterSample": dead_samples,
        "allDelivered": all_delivered,
        "drained": drained,
        "pending": pending,
        "inflight": inflight,
        "perCell": {c: {"pending": s.get("pending"), "inflight": s.get("inflight"),
                        "deadLetters": s.get("deadLetters"), "alarmAt": s.get("alarmAt")}
                    for c, s in stats.items()},
        "callbacks": callbacks,
        "timeout503Sent": state.n503,
        "mismatchedMessageIds": state.mismatched_ids,
        "badPath": state.bad_path,
        "badQueueName": state.bad_queue_name,
        "invalidCallbacks": state.invalid.as_dict(),
        "attemptHeaderCounts": dict(state.attempt_headers),
        "successWithAttemptHeaderNot1": state.success_attempt_not_1,
        "unexpectedSinkRequests": sink.unexpected.count,
    }
    failures = []
    if missing:
        failures.append(f"{len(missing)} accepted message(s) never delivered successfully")
    if state.dup_success:
        failures.append(f"{state.dup_success} duplicate successful deliveries")
    if dead_letters:
        failures.append(f"{dead_letters} dead letter(s)")
    if accepted < n:
        failures.append(f"only {accepted}/{n} enqueues accepted ({errors.count} errors)")
    if not drained:
        failures.append(f"cells not drained after {args.timeout:.0f}s (pending {pending}, inflight {inflight})")
    if state.mismatched_ids:
        failures.append(f"{state.mismatched_ids} deliveries with an unexpected x-vqs-message-id")
    if state.invalid.count:
        failures.append(f"{state.invalid.count} invalid callbacks")
    return {
        "workload": "queue",
        "tag": tag,
        "params": {"messages": n, "concurrency": conc, "shards": shards, "cells": cells,
                   "payloadBytes": args.payload_bytes, "bodyBytes": len(bodies[0].encode()) if bodies else 0,
                   "retryEvery": args.retry_every, "queueName": args.queue_name, "targetBaseUrl": target,
                   "timeoutS": args.timeout},
        "timing": {
            "enqueueWallS": round(enqueue_wall, 3),
            "firstSuccessAfterS": round(first_s - t_start, 3) if first_s else None,
            "lastSuccessAfterS": round(delivery_span, 3) if delivery_span else None,
            "allDeliveredAfterS": round(t_delivered - t_start, 3),
            "drainedAfterS": round(t_drained - t_start, 3),
        },
        "enqueuePerS": rate(accepted, enqueue_wall),
        "deliveryPerS": rate(delivered, delivery_span) if delivery_span else 0.0,
        # the upstream perf test divides by (workload start -> drain confirmed by stats polling)
        "deliveryPerSUpstreamStyle": rate(delivered, t_drained - t_start),
        "enqueueLatencyMs": summarize(enqueue_lat),
        "deliveryLatencyMs": {"all": summarize(lat_all), "firstAttempt": summarize(lat_first),
                              "retried": summarize(lat_retried)},
        "integrity": integrity,
        "errors": errors.as_dict(),
        "cpu": {"enqueuePhase": cpu_enqueue, "wholeRun": cpu_all},
        "failures": failures,
        "ok": not failures,
    }


def print_queue(r: dict):
    p, i = r["params"], r["integrity"]
    print(f"  params      messages={p['messages']} concurrency={p['concurrency']} cells={','.join(p['cells'])} "
          f"body={p['bodyBytes']}B retryEvery={p['retryEvery']}")
    print(f"  enqueue/s   {r['enqueuePerS']:>10.1f}   ({i['accepted']} accepted in {r['timing']['enqueueWallS']:.3f}s)")
    print(f"  delivery/s  {r['deliveryPerS']:>10.1f}   ({i['delivered']} delivered; first enqueue -> last success "
          f"{fmt(r['timing']['lastSuccessAfterS'], 3)}s; upstream-style incl. drain poll "
          f"{r['deliveryPerSUpstreamStyle']:.1f}/s)")
    print(f"  enqueue RPC ms        {fmt_lat(r['enqueueLatencyMs'])}")
    d = r["deliveryLatencyMs"]
    print(f"  delivery ms all       {fmt_lat(d['all'])}")
    print(f"  delivery ms 1st-try   {fmt_lat(d['firstAttempt'])}")
    print(f"  delivery ms retried   {fmt_lat(d['retried'])}")
    cells = "  ".join(f"{c}: pend {s['pending']} infl {s['inflight']} dlq {s['deadLetters']}"
                      for c, s in i["perCell"].items())
    print(f"  integrity   accepted {i['accepted']}/{i['messages']}, delivered {i['delivered']}, missing {i['missing']}, "
          f"dup-success {i['duplicateSuccesses']}, dead letters {i['deadLetters']}, mismatched ids "
          f"{i['mismatchedMessageIds']}, invalid callbacks {i['invalidCallbacks']['count']}, "
          f"callbacks {i['callbacks']} ({i['timeout503Sent']} x 503), "
          f"attempt headers {i['attemptHeaderCounts']}")
    print(f"  final       {cells}")
    print(f"  cpu enqueue {fmt_cpu(r['cpu']['enqueuePhase'])}")
    print(f"  cpu whole   {fmt_cpu(r['cpu']['wholeRun'])}")


# ============================================================================ workload: events

def payload_bytes(tag: str, size: int) -> bytes:
    b = (tag.encode() + b"|")
    return (b * (size // len(b) + 1))[:size]


def run_events(args, tag: str, server_pids) -> dict:
    R, conc, steps = args.runs, args.event_concurrency, args.steps
    wf = f"bench_wf_{tag}"
    deployment = f"dpl_bench_{tag}"
    exec_ctx = {"workflowCoreVersion": "bench", "benchTag": tag}
    size = args.event_payload_bytes
    work = Counter(R)
    errors = ErrorLog()
    lock = threading.Lock()
    apply_lat: list[float] = []
    apply_by_type: dict[str, list[float]] = {}
    put_lat: list[float] = []
    run_lat: list[float] = []
    run_ids: list[str] = [None] * R  # type: ignore[list-item]
    completed = [False] * R
    rpc_count = [0]

    def worker(idx, barrier):
        rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
        try:
            rpc.connect()
        except OSError as e:
            errors.add("connect", str(e))
        safe_wait(barrier)
        la, lp, lr = [], [], []
        by_type: dict[str, list[float]] = {}
        calls = 0

        def put(key: str, value: str):
            nonlocal calls
            t0 = perf()
            calls += 1
            rpc.call("index", "index", "put", [key, value])
            lp.append((perf() - t0) * 1000.0)

        def apply(rid: str, data: dict) -> dict:
            nonlocal calls
            t0 = perf()
            calls += 1
            out = rpc.call("runs", rid, "applyEvent", [{"runId": rid, "data": data}])
            dt = (perf() - t0) * 1000.0
            la.append(dt)
            by_type.setdefault(data["eventType"], []).append(dt)
            if not isinstance(out, dict) or out.get("ok") is not True:
                raise RpcError("outcome", 200, str(out.get("code") if isinstance(out, dict) else "?"),
                               json.dumps(out, default=str)[:200])
            # what the reference client does after a successful applyEvent (spec §6.3)
            run = out.get("run")
            if isinstance(run, dict):
                created = run.get("createdAt")
                cms = created.ms if isinstance(created, JsDate) else parse_iso_ms(str(created))
                meta = json.dumps({"runId": rid, "createdAt": iso_from_ms(cms), "status": run.get("status")},
                                  separators=(",", ":"))
                put(f"run:{run.get('workflowName', wf)}:{ms13(cms)}:{rid}", meta)
                put(f"runall:{ms13(cms)}:{rid}", meta)
            for rel in out.get("releasedHooks") or []:
                calls += 1
                rpc.call("index", "index", "deleteHookIndexes",
                         [rel.get("token"), rel.get("hookId"), {"runId": rid, "hookId": rel.get("hookId")}])
            ev = out.get("event")
            if isinstance(ev, dict) and ev.get("correlationId"):
                ec = ev.get("createdAt")
                ems = ec.ms if isinstance(ec, JsDate) else parse_iso_ms(str(ec))
                put(f"correlation:{encode_uri_component(ev['correlationId'])}:{ms13(ems)}:{ev.get('eventId')}:{rid}",
                    json.dumps({"runId": rid, "eventId": ev.get("eventId")}, separators=(",", ":")))
            return out

        while True:
            i = work.take()
            if i is None:
                break
            rid = "wrun_" + ulid()
            run_ids[i] = rid
            t_run = perf()
            try:
                inp = payload_bytes(f"in{i}", size)
                apply(rid, {"eventType": "run_created", "specVersion": 3,
                            "eventData": {"deploymentId": deployment, "workflowName": wf,
                                          "input": inp, "executionContext": exec_ctx}})
                apply(rid, {"eventType": "run_started", "specVersion": 3,
                            "eventData": {"input": inp, "deploymentId": deployment, "workflowName": wf,
                                          "executionContext": exec_ctx}})
                for s in range(steps):
                    sid = "step_" + ulid()
                    sname = f"step//bench//s{s}"
                    apply(rid, {"eventType": "step_created", "specVersion": 3, "correlationId": sid,
                                "eventData": {"stepName": sname, "workflowName": wf,
                                              "input": payload_bytes(f"si{s}", size)}})
                    apply(rid, {"eventType": "step_started", "specVersion": 3, "correlationId": sid,
                                "eventData": {"stepName": sname}})
                    apply(rid, {"eventType": "step_completed", "specVersion": 3, "correlationId": sid,
                                "eventData": {"stepName": sname, "workflowName": wf,
                                              "result": payload_bytes(f"sr{s}", size)}})
                apply(rid, {"eventType": "run_completed", "specVersion": 3,
                            "eventData": {"output": payload_bytes(f"out{i}", size)}})
                completed[i] = True
                lr.append((perf() - t_run) * 1000.0)
            except RpcError as e:
                errors.add("run-" + e.kind, f"{rid}: {e.short()}")
        rpc.close()
        with lock:
            apply_lat.extend(la)
            put_lat.extend(lp)
            run_lat.extend(lr)
            for k, v in by_type.items():
                apply_by_type.setdefault(k, []).extend(v)
            rpc_count[0] += calls

    meter = CpuMeter(server_pids, args.server_tree, args.cpu_interval)
    threads, barrier = start_barrier_workers(min(conc, R), worker, "ev")
    meter.start()
    safe_wait(barrier)
    t0 = perf()
    for t in threads:
        t.join()
    wall = perf() - t0
    cpu = add_per_rpc(meter.stop(), rpc_count[0])
    n_completed = sum(completed)

    verify = verify_events(args, tag, wf, run_ids, completed, steps) if args.verify else {"skipped": True}
    failures = []
    if errors.count:
        failures.append(f"{errors.count} run(s) failed: {errors.samples[:2]}")
    if args.verify and verify.get("problems"):
        failures.append(f"verification: {verify['problems']} problem(s): {verify['samples'][:2]}")
    events_per_run = 3 + 3 * steps
    return {
        "workload": "events",
        "tag": tag,
        "params": {"runs": R, "concurrency": conc, "steps": steps, "eventPayloadBytes": size,
                   "workflowName": wf, "applyEventsPerRun": events_per_run,
                   "indexPutsPerRun": 6 + 3 * steps},
        "wallS": round(wall, 3),
        "rpcs": rpc_count[0],
        "rpcPerS": rate(rpc_count[0], wall),
        "applyEventPerS": rate(len(apply_lat), wall),
        "runsCompleted": n_completed,
        "runsPerS": rate(n_completed, wall),
        "applyEventLatencyMs": summarize(apply_lat),
        "applyEventLatencyByTypeMs": {k: summarize(v) for k, v in sorted(apply_by_type.items())},
        "indexPutLatencyMs": summarize(put_lat),
        "runLatencyMs": summarize(run_lat),
        "verification": verify,
        "errors": errors.as_dict(),
        "cpu": cpu,
        "failures": failures,
        "ok": not failures,
    }


def verify_events(args, tag: str, wf: str, run_ids, completed, steps: int) -> dict:
    """Outside the timed window: every run is completed, has the expected event log, and is indexed."""
    expected_types = (["run_created", "run_started"]
                      + ["step_created", "step_started", "step_completed"] * steps + ["run_completed"])
    problems = ErrorLog()
    todo = Counter(len(run_ids))
    t0 = perf()

    def worker(idx, barrier):
        rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
        safe_wait(barrier)
        while True:
            i = todo.take()
            if i is None:
                break
            rid = run_ids[i]
            if rid is None or not completed[i]:
                continue
            try:
                run = rpc.call("runs", rid, "getRun", [])
                if not isinstance(run, dict) or run.get("status") != "completed":
                    problems.add("run-status", f"{rid}: {str(run)[:120]}")
                page = rpc.call("runs", rid, "listEvents", [{"limit": 1000}])
                types = [e.get("eventType") for e in page.get("data", [])]
                ids = [e.get("eventId") for e in page.get("data", [])]
                if types != expected_types:
                    problems.add("event-log", f"{rid}: {types}")
                if ids != sorted(ids) or len(set(ids)) != len(ids):
                    problems.add("event-ids", f"{rid}: {ids[:4]}")
            except RpcError as e:
                problems.add("rpc-" + e.kind, f"{rid}: {e.short()}")
        rpc.close()

    threads, barrier = start_barrier_workers(min(args.event_concurrency, max(1, len(run_ids))), worker, "vf")
    safe_wait(barrier)
    for t in threads:
        t.join()
    # run:<wf>: index entries -- one per run, final status "completed"
    indexed, index_status_bad = 0, 0
    rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
    try:
        listing = rpc.call("index", "index", "list", [{"prefix": f"run:{wf}:", "limit": len(run_ids) + 10}])
        keys = [k.get("name") for k in listing.get("keys", [])]
        indexed = len(keys)
        want = {rid for rid, ok in zip(run_ids, completed) if ok}
        have = {k.rsplit(":", 1)[-1] for k in keys}
        if want - have:
            problems.add("run-index-missing", f"{len(want - have)} runs without a run: key")
        for k in keys:
            meta = rpc.call("index", "index", "get", [k])
            try:
                if json.loads(meta).get("status") != "completed":
                    index_status_bad += 1
            except (TypeError, ValueError, AttributeError):
                index_status_bad += 1
        if index_status_bad:
            problems.add("run-index-status", f"{index_status_bad} run: keys not at status completed")
    except RpcError as e:
        problems.add("index-" + e.kind, e.short())
    rpc.close()
    return {"runsChecked": sum(1 for c in completed if c), "runKeysIndexed": indexed,
            "problems": problems.count, "byKind": problems.by_kind, "samples": problems.samples,
            "wallS": round(perf() - t0, 3)}


def print_events(r: dict):
    p = r["params"]
    print(f"  params      runs={p['runs']} concurrency={p['concurrency']} steps/run={p['steps']} "
          f"(applyEvents/run={p['applyEventsPerRun']}, index puts/run={p['indexPutsPerRun']}) payload={p['eventPayloadBytes']}B")
    print(f"  RPCs/s      {r['rpcPerS']:>10.1f}   ({r['rpcs']} RPCs in {r['wallS']:.3f}s; "
          f"applyEvent/s {r['applyEventPerS']:.1f}; runs/s {r['runsPerS']:.2f}, {r['runsCompleted']}/{p['runs']} completed)")
    print(f"  applyEvent ms         {fmt_lat(r['applyEventLatencyMs'])}")
    for k, v in r["applyEventLatencyByTypeMs"].items():
        print(f"    {k:<18}  p50 {fmt(v['p50'], 2):>8}  p99 {fmt(v['p99'], 2):>8}  n={v['count']}")
    print(f"  index put ms          {fmt_lat(r['indexPutLatencyMs'])}")
    print(f"  run ms                {fmt_lat(r['runLatencyMs'])}")
    v = r["verification"]
    if v.get("skipped"):
        print("  verify      skipped")
    else:
        print(f"  verify      {v['runsChecked']} runs checked, {v['runKeysIndexed']} run: keys, problems {v['problems']} "
              f"{v['byKind'] or ''} ({v['wallS']:.2f}s)")
    print(f"  errors      {r['errors']['count']} {r['errors']['byKind'] or ''}")
    print(f"  cpu         {fmt_cpu(r['cpu'])}")


# ============================================================================ workload: streams

_FILLER = bytes(range(256)) * 64  # every byte value, so the bytes codec is exercised


def chunk_content(label: str, item: int, size: int) -> bytes:
    head = f"{label}:{item:09d}:".encode()
    if len(head) >= size:
        return head[:size]
    return head + _FILLER[(item * 7) % 256:][: size - len(head)]


def run_stream_phase(args, tag: str, writers: int, server_pids) -> dict:
    K, size, page = args.chunks, args.chunk_bytes, args.page_size
    sname = f"bench-{tag}-w{writers}"
    cell = f"stream:{sname}"
    errors = ErrorLog()
    setup = RpcClient(args.url, args.secret, args.rpc_timeout)
    try:
        # the client registers the stream for its run before the first write (spec §8.3)
        setup.call("streams", f"run-streams:wrun_bench_{tag}", "registerStream", [sname])
    except RpcError as e:
        errors.add("register-" + e.kind, e.short())

    work = Counter(K)
    index_of = [None] * K
    write_lat: list[float] = []
    lock = threading.Lock()

    def writer(idx, barrier):
        rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
        try:
            rpc.connect()
        except OSError as e:
            errors.add("connect", str(e))
        safe_wait(barrier)
        lat = []
        while True:
            item = work.take()
            if item is None:
                break
            data = chunk_content(sname, item, size)
            t0 = perf()
            try:
                got = rpc.call("streams", cell, "writeChunk", [data])
            except RpcError as e:
                errors.add("write-" + e.kind, e.short())
                continue
            lat.append((perf() - t0) * 1000.0)
            if isinstance(got, int) and not isinstance(got, bool):
                index_of[item] = got
            else:
                errors.add("write-result", repr(got)[:80])
        rpc.close()
        with lock:
            write_lat.extend(lat)

    meter_w = CpuMeter(server_pids, args.server_tree, args.cpu_interval)
    threads, barrier = start_barrier_workers(writers, writer, f"sw{writers}")
    meter_w.start()
    safe_wait(barrier)
    t0 = perf()
    for t in threads:
        t.join()
    write_wall = perf() - t0
    cpu_w = add_per_rpc(meter_w.stop(), K)
    written = sum(1 for x in index_of if x is not None)
    idx_values = [x for x in index_of if x is not None]
    dense = sorted(idx_values) == list(range(K))
    if not dense:
        errors.add("indexes", f"returned indexes are not exactly 0..{K - 1} "
                              f"(unique {len(set(idx_values))}, min {min(idx_values, default=None)}, "
                              f"max {max(idx_values, default=None)})")
    try:
        setup.call("streams", cell, "closeStream", [])
        info = setup.call("streams", cell, "getInfo", [])
    except RpcError as e:
        errors.add("close-" + e.kind, e.short())
        info = None
    if not (isinstance(info, dict) and info.get("tailIndex") == K - 1 and info.get("done") is True):
        errors.add("info", f"getInfo after close: {info!r}")
    setup.close()

    # ---- read it back the way the client's readFromStream does: getChunks pages of `page`
    item_at = {v: k for k, v in enumerate(index_of) if v is not None}
    reader = RpcClient(args.url, args.secret, args.rpc_timeout)
    page_lat: list[float] = []
    nonempty_lat: list[float] = []
    final_page_ms = None
    read, bad_content, next_idx, empty_not_done = 0, 0, 0, 0
    try:
        reader.connect()
    except OSError as e:
        errors.add("connect", str(e))
    meter_r = CpuMeter(server_pids, args.server_tree, args.cpu_interval)
    meter_r.start()
    t1 = perf()
    while True:
        ts = perf()
        try:
            res = reader.call("streams", cell, "getChunks", [{"startIndex": next_idx, "limit": page}])
        except RpcError as e:
            errors.add("read-" + e.kind, e.short())
            break
        dt = (perf() - ts) * 1000.0
        page_lat.append(dt)
        chunks = res.get("chunks") if isinstance(res, dict) else None
        if not isinstance(chunks, list):
            errors.add("read-shape", repr(res)[:120])
            break
        if chunks:
            nonempty_lat.append(dt)
            for j, c in enumerate(chunks):
                item = item_at.get(next_idx + j)
                if item is None or c != chunk_content(sname, item, size):
                    bad_content += 1
            read += len(chunks)
            next_idx += len(chunks)
            continue
        if res.get("done"):
            final_page_ms = dt
            break
        empty_not_done += 1            # should not happen on a closed stream
        if empty_not_done > 20:
            errors.add("read-stall", f"no chunks and not done at index {next_idx}")
            break
        time.sleep(0.05)
    read_wall = perf() - t1
    cpu_r = add_per_rpc(meter_r.stop(), len(page_lat))
    reader.close()
    if read != K:
        errors.add("read-count", f"read {read} chunks, wrote {K}")
    if bad_content:
        errors.add("read-content", f"{bad_content} chunks differ from what was written")
    n_edge = min(5, len(nonempty_lat))
    return {
        "writers": writers,
        "stream": sname,
        "chunksWritten": written,
        "indexesDense": dense,
        "writeWallS": round(write_wall, 3),
        "writePerS": rate(written, write_wall),
        "writeMiBPerS": round(written * size / max(write_wall, 1e-9) / 1048576, 2),
        "writeLatencyMs": summarize(write_lat),
        "readWallS": round(read_wall, 3),
        "chunksRead": read,
        "readPerS": rate(read, read_wall),
        "readMiBPerS": round(read * size / max(read_wall, 1e-9) / 1048576, 2),
        "pages": len(page_lat),
        "pageLatencyMs": summarize(page_lat),
        "firstPageMs": round(nonempty_lat[0], 3) if nonempty_lat else None,
        "lastPageMs": round(nonempty_lat[-1], 3) if nonempty_lat else None,
        "first5PagesMeanMs": round(statistics.fmean(nonempty_lat[:n_edge]), 3) if n_edge else None,
        "last5PagesMeanMs": round(statistics.fmean(nonempty_lat[-n_edge:]), 3) if n_edge else None,
        "finalEmptyPageMs": round(final_page_ms, 3) if final_page_ms is not None else None,
        "badContent": bad_content,
        "errors": errors.as_dict(),
        "cpu": {"write": cpu_w, "read": cpu_r},
    }


def run_streams(args, tag: str, server_pids) -> dict:
    phases = []
    for w in args.stream_writers:
        phases.append(run_stream_phase(args, tag, w, server_pids))
        time.sleep(min(args.cooldown, 0.5))
    failures = []
    for ph in phases:
        if ph["errors"]["count"]:
            failures.append(f"w{ph['writers']}: {ph['errors']['count']} error(s): {ph['errors']['samples'][:2]}")
    return {
        "workload": "streams",
        "tag": tag,
        "params": {"chunks": args.chunks, "chunkBytes": args.chunk_bytes, "pageSize": args.page_size,
                   "writers": args.stream_writers},
        "phases": phases,
        "failures": failures,
        "ok": not failures,
    }


def print_streams(r: dict):
    p = r["params"]
    print(f"  params      chunks={p['chunks']} x {p['chunkBytes']}B, getChunks page={p['pageSize']}")
    for ph in r["phases"]:
        w = ph["writers"]
        print(f"  [{w} writer{'s' if w != 1 else ''}] write/s {ph['writePerS']:>9.1f}  ({ph['chunksWritten']} chunks in "
              f"{ph['writeWallS']:.3f}s, {ph['writeMiBPerS']:.2f} MiB/s, dense indexes {ph['indexesDense']})")
        print(f"      writeChunk ms     {fmt_lat(ph['writeLatencyMs'])}")
        print(f"      read chunks/s {ph['readPerS']:>9.1f}  ({ph['chunksRead']} chunks, {ph['pages']} pages in "
              f"{ph['readWallS']:.3f}s, {ph['readMiBPerS']:.2f} MiB/s, bad content {ph['badContent']})")
        print(f"      page ms           {fmt_lat(ph['pageLatencyMs'])}")
        print(f"      first page {fmt(ph['firstPageMs'], 2)} ms, last page {fmt(ph['lastPageMs'], 2)} ms "
              f"(first-5 mean {fmt(ph['first5PagesMeanMs'], 2)}, last-5 mean {fmt(ph['last5PagesMeanMs'], 2)}, "
              f"final empty page {fmt(ph['finalEmptyPageMs'], 2)})")
        print(f"      errors {ph['errors']['count']} {ph['errors']['byKind'] or ''}")
        print(f"      cpu write   {fmt_cpu(ph['cpu']['write'])}")
        print(f"      cpu read    {fmt_cpu(ph['cpu']['read'])}")


# ============================================================================ summaries

def headline(r: dict) -> dict:
    """The figures that are compared across repeats (flat name -> number)."""
    h: dict[str, float] = {}

    def cpu(prefix: str, c: dict):
        h[f"{prefix}clientCpuPctOfCore"] = c.get("clientCpuPctOfCore")
        if "serverCpuPctAvg" in c:
            h[f"{prefix}serverCpuPctAvg"] = c.get("serverCpuPctAvg")
            h[f"{prefix}serverCpuPctPeak"] = c.get("serverCpuPctPeak")
        h[f"{prefix}machineBusyPct"] = c.get("machineBusyPct")
        h[f"{prefix}otherCpuPctOfCore"] = c.get("otherCpuPctOfCore")
        h[f"{prefix}stealPct"] = c.get("stealPct")
        h[f"{prefix}clientCpuUsPerRpc"] = c.get("clientCpuUsPerRpc")

    if r["workload"] == "queue":
        h["enqueuePerS"] = r["enqueuePerS"]
        h["deliveryPerS"] = r["deliveryPerS"]
        h["deliveryPerSUpstreamStyle"] = r["deliveryPerSUpstreamStyle"]
        for q in ("p50", "p95", "p99", "max"):
            h[f"enqueueMs.{q}"] = r["enqueueLatencyMs"][q]
        for kind in ("all", "firstAttempt", "retried"):
            for q in ("p50", "p95", "p99", "max"):
                h[f"deliveryMs.{kind}.{q}"] = r["deliveryLatencyMs"][kind][q]
        cpu("enqueuePhase.", r["cpu"]["enqueuePhase"])
        cpu("wholeRun.", r["cpu"]["wholeRun"])
    elif r["workload"] == "events":
        h["rpcPerS"] = r["rpcPerS"]
        h["applyEventPerS"] = r["applyEventPerS"]
        h["runsPerS"] = r["runsPerS"]
        for q in ("p50", "p95", "p99", "max"):
            h[f"applyEventMs.{q}"] = r["applyEventLatencyMs"][q]
        for q in ("p50", "p95", "p99"):
            h[f"indexPutMs.{q}"] = r["indexPutLatencyMs"][q]
        cpu("", r["cpu"])
    elif r["workload"] == "streams":
        for ph in r["phases"]:
            w = f"w{ph['writers']}."
            h[w + "writePerS"] = ph["writePerS"]
            h[w + "writeMs.p50"] = ph["writeLatencyMs"]["p50"]
            h[w + "writeMs.p99"] = ph["writeLatencyMs"]["p99"]
            h[w + "readPerS"] = ph["readPerS"]
            h[w + "firstPageMs"] = ph["firstPageMs"]
            h[w + "lastPageMs"] = ph["lastPageMs"]
            h[w + "pageMs.p50"] = ph["pageLatencyMs"]["p50"]
            cpu(w + "write.", ph["cpu"]["write"])
            cpu(w + "read.", ph["cpu"]["read"])
    return {k: v for k, v in h.items() if v is not None}


def phase_cpus(r: dict) -> list:
    if r["workload"] == "queue":
        return [r["cpu"]["enqueuePhase"], r["cpu"]["wholeRun"]]
    if r["workload"] == "events":
        return [r["cpu"]]
    return [c for ph in r.get("phases", []) for c in (ph["cpu"]["write"], ph["cpu"]["read"])]


def summarize_runs(results: list[dict]) -> dict:
    keys: list[str] = []
    heads = [headline(r) for r in results]
    for h in heads:
        for k in h:
            if k not in keys:
                keys.append(k)
    out = {}
    for k in keys:
        vals = [h[k] for h in heads if k in h]
        med = statistics.median(vals)
        spread = (max(vals) - min(vals)) / med * 100.0 if med else None
        out[k] = {"median": round(med, 3), "min": min(vals), "max": max(vals),
                  "spreadPct": round(spread, 1) if spread is not None else None, "values": vals}
    return out


def print_summary(workload: str, summary: dict, n: int, contaminated: int = 0):
    note = f"; {contaminated} run(s) flagged as contaminated by other load" if contaminated else ""
    print(f"\n== {workload}: median over {n} run(s)  [min .. max]  (spread = (max-min)/median){note}")
    for k, s in summary.items():
        spread = "" if s["spreadPct"] is None else f"{s['spreadPct']:.0f}%"
        print(f"  {k:<42} {s['median']:>12.2f}   [{s['min']:.2f} .. {s['max']:.2f}]   {spread}")


# ============================================================================ main

def health_and_auth(args) -> dict:
    u = urllib.parse.urlsplit(args.url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port or (443 if u.scheme == "https" else 80), timeout=10)
    try:
        conn.request("GET", u.path.rstrip("/") + "/v1/health")
        resp = conn.getresponse()
        body = resp.read()
    except OSError as e:
        raise SystemExit(f"bench: cannot reach {args.url}/v1/health: {e}") from None
    finally:
        conn.close()
    try:
        health = json.loads(body)
    except ValueError:
        health = {"raw": body[:200].decode("utf-8", "replace")}
    if resp.status != 200:
        raise SystemExit(f"bench: health check answered {resp.status}: {health}")
    rpc = RpcClient(args.url, args.secret, args.rpc_timeout)
    try:
        rpc.call("index", "index", "get", ["__bench_probe__"])
    except RpcError as e:
        raise SystemExit(f"bench: authenticated probe index.get failed: {e.short()}") from None
    finally:
        rpc.close()
    return health


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the workload definitions.")
    ap.add_argument("--url", required=True, help="fleet base URL, e.g. http://127.0.0.1:18811")
    ap.add_argument("--secret", default=os.environ.get("WORLD_SECRET"), help="bearer secret (default $WORLD_SECRET)")
    ap.add_argument("--workload", required=True, choices=["queue", "events", "streams", "all"])
    ap.add_argument("--json", metavar="OUT.json", help="write every figure to this file")
    ap.add_argument("--quick", action="store_true", help="shrink every workload ~10x (smoke run)")
    ap.add_argument("--repeat", type=int, default=1, help="run each workload N times; report medians (default 1)")
    ap.add_argument("--cooldown", type=float, default=1.0, help="seconds to pause between runs (default 1)")
    ap.add_argument("--warmup", action="store_true",
                    help="run each workload once at 1/10 size before the measured runs (not counted)")
    ap.add_argument("--tag", default=None, help="unique run tag prefix (default: random)")
    ap.add_argument("--rpc-timeout", type=float, default=30.0, help="per-RPC timeout seconds (default 30)")
    ap.add_argument("--server-pid", action="append", default=[],
                    help="PID(s) of the server to sample CPU from /proc (repeatable, comma-separated)")
    ap.add_argument("--server-tree", action="store_true", help="also count the server PIDs' descendants")
    ap.add_argument("--cpu-interval", type=float, default=0.25, help="server CPU sampling window for peaks (s)")
    ap.add_argument("--other-threshold", type=float, default=25.0,
                    help="flag a run as contaminated when other processes used more than this %% of a core "
                         "(needs --server-pid; default 25)")
    ap.add_argument("--stock-http", action="store_true",
                    help="keep http.client's email-based header parser (costs the client ~30%% more CPU)")
    g = ap.add_argument_group("queue")
    g.add_argument("--messages", type=int, default=1000)
    g.add_argument("--concurrency", type=int, default=32)
    g.add_argument("--shards", type=int, default=2, help="queue cells q:b<tag>-<i> (config.queueShards)")
    g.add_argument("--payload-bytes", type=int, default=256, help="exact size of each message body")
    g.add_argument("--retry-every", type=int, default=20, help="every Nth message answered once with 503 {timeoutSeconds:0}; 0 = never")
    g.add_argument("--timeout", type=float, default=120.0, help="max seconds from first enqueue to drain")
    g.add_argument("--settle", type=float, default=1.0, help="seconds to keep listening for late duplicates after drain")
    g.add_argument("--queue-name", default="__wkf_step_bench")
    g.add_argument("--sink-host", default="127.0.0.1", help="address the sink listens on")
    g.add_argument("--sink-port", type=int, default=0, help="sink port (default: ephemeral)")
    g.add_argument("--target-base-url", default=None,
                   help="targetBaseUrl sent to the server (default http://<sink-host>:<sink-port>)")
    g = ap.add_argument_group("events")
    g.add_argument("--runs", type=int, default=100)
    g.add_argument("--event-concurrency", type=int, default=16)
    g.add_argument("--steps", type=int, default=5)
    g.add_argument("--event-payload-bytes", type=int, default=64, help="size of input/result/output bytes")
    g.add_argument("--no-verify", dest="verify", action="store_false", help="skip the post-run verification")
    g = ap.add_argument_group("streams")
    g.add_argument("--chunks", type=int, default=5000)
    g.add_argument("--chunk-bytes", type=int, default=1024)
    g.add_argument("--stream-writers", default="1,8", help="comma-separated writer counts, one phase each")
    g.add_argument("--page-size", type=int, default=32)
    args = ap.parse_args(argv)
    if not args.secret:
        ap.error("--secret is required (or set WORLD_SECRET)")
    if args.quick:
        args.messages = max(1, args.messages // 10)
        args.runs = max(1, args.runs // 10)
        args.chunks = max(1, args.chunks // 10)
        args.settle = min(args.settle, 0.3)
        args.cooldown = min(args.cooldown, 0.3)
    try:
        args.stream_writers = [int(x) for x in str(args.stream_writers).split(",") if x.strip()]
    except ValueError:
        ap.error("--stream-writers must be a comma-separated list of integers")
    pids = []
    for item in args.server_pid:
        for x in str(item).split(","):
            if x.strip():
                try:
                    pids.append(int(x))
                except ValueError:
                    ap.error(f"bad --server-pid {x!r}")
    args.server_pids = pids
    if args.repeat < 1 or args.messages < 1 or args.concurrency < 1 or args.shards < 1 or args.runs < 1 \
            or args.event_concurrency < 1 or args.chunks < 1 or args.page_size < 1 or not args.stream_writers:
        ap.error("counts must be positive")
    args.url = args.url.rstrip("/")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.stock_http:
        install_fast_headers()
    workloads = ["queue", "events", "streams"] if args.workload == "all" else [args.workload]
    base_tag = args.tag or f"{int(time.time()) % 46656:x}{random.randrange(16 ** 3):03x}"
    try:
        health = health_and_auth(args)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    meta = {
        "bench": BENCH_VERSION,
        "url": args.url,
        "health": health,
        "workloads": workloads,
        "repeat": args.repeat,
        "quick": args.quick,
        "tag": base_tag,
        "startedAt": iso_from_ms(int(time.time() * 1000)),
        "python": platform.python_version(),
        "host": platform.node(),
        "ncpu": NCPU,
        "clientAffinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "serverPids": args.server_pids,
        "serverAffinity": {},
        "argv": sys.argv[1:],
    }
    for p in args.server_pids:
        try:
            meta["serverAffinity"][str(p)] = sorted(os.sched_getaffinity(p))
        except OSError:
            pass
    meta["machineBusyBeforeStartPct"] = machine_idle_check(1.0)
    busy0 = meta["machineBusyBeforeStartPct"].get("cpu")
    if busy0 is not None and busy0 > 15:
        print(f"WARNING: the machine was {busy0:.0f}% busy before the benchmark started "
              f"({meta['machineBusyBeforeStartPct']}); figures will be contaminated", file=sys.stderr)
    print(f"bench {BENCH_VERSION}: {args.url} health={health} workloads={workloads} repeat={args.repeat} "
          f"quick={args.quick} tag={base_tag} client-cpus={meta['clientAffinity']} "
          f"server-pids={args.server_pids} {meta['serverAffinity'] or ''}")

    sink = None
    if "queue" in workloads:
        try:
            sink = Sink(args.sink_host, args.sink_port)
        except OSError as e:
            print(f"bench: cannot start the sink on {args.sink_host}:{args.sink_port}: {e}", file=sys.stderr)
            return 2
        print(f"sink listening on http://{sink.host}:{sink.port}")

    results: dict[str, list[dict]] = {w: [] for w in workloads}
    all_failures: list[str] = []
    warmups: list[dict] = []
    try:
        if args.warmup:
            wargs = argparse.Namespace(**vars(args))
            wargs.messages = max(1, args.messages // 10)
            wargs.runs = max(1, args.runs // 10)
            wargs.chunks = max(1, args.chunks // 10)
            wargs.settle = min(args.settle, 0.3)
            for w in workloads:
                tag = f"{base_tag}w{w[0]}"
                t0 = perf()
                if w == "queue":
                    r = run_queue(wargs, tag, sink, args.server_pids)
                elif w == "events":
                    r = run_events(wargs, tag, args.server_pids)
                else:
                    r = run_streams(wargs, tag, args.server_pids)
                warmups.append(r)
                print(f"warm-up {w}: {'OK' if r['ok'] else 'FAIL ' + '; '.join(r['failures'])} "
                      f"({perf() - t0:.1f}s, not counted)")
                time.sleep(args.cooldown)
        for rep in range(args.repeat):
            for w in workloads:
                tag = f"{base_tag}{rep}{w[0]}"
                print(f"\n== {w}  run {rep + 1}/{args.repeat}  tag={tag}")
                sys.stdout.flush()
                if w == "queue":
                    r = run_queue(args, tag, sink, args.server_pids)
                    print_queue(r)
                elif w == "events":
                    r = run_events(args, tag, args.server_pids)
                    print_events(r)
                else:
                    r = run_streams(args, tag, args.server_pids)
                    print_streams(r)
                r["repeat"] = rep + 1
                other = max((c.get("otherCpuPctOfCore") or 0.0) for c in phase_cpus(r)) if phase_cpus(r) else 0.0
                r["maxOtherCpuPctOfCore"] = other
                r["contaminated"] = other > args.other_threshold
                if r["contaminated"]:
                    print(f"  (!) up to {other:.0f}% of a core was used by neither the client nor the server "
                          f"during this run: the figures are contaminated by other load")
                results[w].append(r)
                status = "OK" if r["ok"] else "FAIL: " + "; ".join(r["failures"])
                print(f"  => {status}")
                all_failures += [f"{w}#{rep + 1}: {f}" for f in r["failures"]]
                sys.stdout.flush()
                time.sleep(args.cooldown)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        all_failures.append("interrupted")
    finally:
        if sink is not None:
            meta["sinkUnexpected"] = sink.unexpected.as_dict()
            sink.stop()

    summaries = {w: summarize_runs(rs) for w, rs in results.items() if rs}
    for w, s in summaries.items():
        print_summary(w, s, len(results[w]), sum(1 for r in results[w] if r.get("contaminated")))
    print(f"\n{'ALL INTEGRITY CHECKS PASSED' if not all_failures else 'FAILURES:'}")
    for f in all_failures:
        print(f"  - {f}")
    if args.json:
        doc = {"meta": meta, "summary": summaries, "runs": results, "failures": all_failures,
               "ok": not all_failures, "warmup": warmups}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0 if not all_failures else 1


if __name__ == "__main__":
    sys.exit(main())
