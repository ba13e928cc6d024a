"""Prometheus metrics (prometheus-client) at ``/metrics`` (docs/operations.md "Metrics").

Two kinds:

* **Recorded** where things happen — ``observe_rpc`` (one call in
  ``worldcell.rpc.handle``), ``record_enqueue`` and ``record_delivery`` (one call
  each in ``queueing``) — as counters and histograms. Under gunicorn's several
  worker processes set ``PROMETHEUS_MULTIPROC_DIR`` (the shipped gunicorn config
  ``worldcell/gunicorn_conf.py`` empties it at start and marks dead workers);
  every process then writes its values to files there and a scrape of any of
  them adds them up. A Celery worker (threads pool: one process) serves its
  own delivery metrics on ``WORLDCELL_WORKER_METRICS_PORT``.
* **Computed at scrape time** from the database (``DatabaseCollector``), with
  index-only queries bounded per shard: pending / in-flight / dead messages
  per queue shard, the most overdue alarm, active runs by status, build info.

``WORLDCELL_METRICS=false`` turns recording off (the functions return at once)
and ``/metrics`` answers 404. ``METRICS_TOKEN``, when set, must be sent as
``Authorization: Bearer <token>``.
"""
from __future__ import annotations

import hmac
import os
import platform
import threading
import time
from typing import Any, Iterable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import clock, dispatch

__all__ = ["DatabaseCollector", "observe_rpc", "record_delivery", "record_enqueue", "record_expired", "record_repair",
           "registry", "view"]

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
ENABLED: bool = bool(getattr(settings, "METRICS_ENABLED", True))

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DELIVERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

RPC_REQUESTS = Counter(
    "worldcell_rpc_requests", "RPC and health requests answered, by binding, method and HTTP status",
    ["binding", "method", "status"],
)
RPC_LATENCY = Histogram(
    "worldcell_rpc_request_duration_seconds", "Time to answer an RPC request (s), by binding and method",
    ["binding", "method"], buckets=_LATENCY_BUCKETS,
)
QUEUE_ENQUEUED = Counter("worldcell_queue_enqueued", "Messages stored by enqueue (not deduplicated)", ["queue"])
QUEUE_DEDUPED = Counter("worldcell_queue_deduped", "Enqueues answered from a live idempotency key", ["queue"])
#: run lifecycle (docs/lifecycle.md): runs fenced by retention, stuck runs re-enqueued
RUNS_EXPIRED = Counter("worldcell_runs_expired", "Runs expired by the retention sweep (tombstoned)")
STUCK_RUN_REPAIRS = Counter("worldcell_stuck_run_repairs", "Stuck runs whose workflow message was re-enqueued")
#: outcome: delivered (2xx), retried (counted failure), rescheduled (503 + timeoutSeconds),
#: dropped (404/409/410/422), dead_lettered, stale (the claim was no longer current)
QUEUE_DELIVERIES = Counter(
    "worldcell_queue_deliveries", "Delivery attempts finished, by queue name and outcome", ["queue", "outcome"],
)
QUEUE_DELIVERY_LATENCY = Histogram(
    "worldcell_queue_delivery_latency_seconds",
    "From a message's due time to its delivery's answer (s); first attempts measure from enqueue",
    ["queue"], buckets=_DELIVERY_BUCKETS,
)
QUEUE_ATTEMPT_DURATION = Histogram(
    "worldcell_queue_attempt_duration_seconds", "Duration of one delivery POST (s)", ["queue"],
    buckets=_LATENCY_BUCKETS,
)

_OUTCOMES = {
    "acked": "delivered",
    "retry scheduled": "retried",
    "redelivery scheduled": "rescheduled",
    "dropped": "dropped",
    "dead-lettered": "dead_lettered",
    "stale": "stale",
}


# --------------------------------------------------------------------------- recording


def _rpc_labels(path: str) -> tuple[str, str]:
    """``(binding, method)`` labels of a request path, from the dispatch table only (bounded cardinality)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) == 2 and parts[0] == "v1" and parts[1] == "health":
        return "health", "health"
    if len(parts) == 5 and parts[0] == "v1" and parts[1] == "rpc":
        methods = dispatch.KNOWN_BINDINGS.get(parts[2])
        if methods is not None:
            return parts[2], parts[4] if parts[4] in methods else "other"
    return "other", "other"


def observe_rpc(path: str, status: int, seconds: float) -> None:
    """Count one answered request to ``path`` (``request.path_info``) with ``status``, taking ``seconds``."""
    if not ENABLED:
        return
    binding, method = _rpc_labels(path)
    RPC_REQUESTS.labels(binding, method, str(status)).inc()
    RPC_LATENCY.labels(binding, method).observe(seconds)


#: the Workflow DevKit's queue-name prefixes and their overflow labels
_KINDS = (("__wkf_workflow_", "other_workflow"), ("__wkf_step_", "other_step"))
#: a longer queue name is never a label value by itself
_MAX_LABEL_CHARS = 200
_queue_labels_lock = threading.Lock()
_queue_labels: set[str] = set()


def queue_label(queue_name: str) -> str:
    """The ``queue`` label value of ``queue_name``: bounded cardinality per process.

    ``queueName`` is chosen by the client (up to 1024 bytes), so only the first
    ``METRICS_QUEUE_NAMES`` (default 100) distinct names a process sees, each at most
    200 characters, label by themselves; every later one counts under its Workflow
    DevKit kind: ``other_workflow`` (``__wkf_workflow_…``), ``other_step``
    (``__wkf_step_…``) or ``other``. A real app has one queue name per workflow and
    step function, far fewer than the limit (docs/operations.md "Metrics").
    """
    if queue_name in _queue_labels:
        return queue_name
    limit = int(getattr(settings, "METRICS_QUEUE_NAMES", 100))
    if len(queue_name) <= _MAX_LABEL_CHARS:
        with _queue_labels_lock:
            if queue_name in _queue_labels or len(_queue_labels) < limit:
                _queue_labels.add(queue_name)
                return queue_name
    for prefix, overflow in _KINDS:
        if queue_name.startswith(prefix):
            return overflow
    return "other"


def reset_queue_labels() -> None:
    """Forget the queue names seen so far (tests: each starts with an empty set)."""
    with _queue_labels_lock:
        _queue_labels.clear()


def record_enqueue(queue_name: str, deduped: bool) -> None:
    """Count one enqueue of queue ``queue_name`` (the request's ``queueName``; label: ``queue_label``)."""
    if not ENABLED:
        return
    (QUEUE_DEDUPED if deduped else QUEUE_ENQUEUED).labels(queue_label(queue_name)).inc()


def record_expired(n: int) -> None:
    """Count ``n`` runs expired by one retention sweep."""
    if ENABLED and n:
        RUNS_EXPIRED.inc(n)


def record_repair() -> None:
    """Count one stuck-run repair."""
    if ENABLED:
        STUCK_RUN_REPAIRS.inc()


def record_delivery(row: Any, result: str, attempt_seconds: float, answered_ms: int | None = None) -> None:
    """Record one finished delivery of ``row`` (a ``DeliveryRow``) whose outcome was ``result``.

    ``result`` is ``machine.apply_outcome``'s label (``"acked"``, ``"retry scheduled"``, …);
    ``attempt_seconds`` the POST's duration; ``answered_ms`` (epoch ms, default now)
    when the answer came. Latency runs from ``row.due_at`` when the row carries it,
    else — first attempts only — from ``row.enqueued_at``.
    """
    if not ENABLED:
        return
    queue = queue_label(row.queue_name)
    QUEUE_DELIVERIES.labels(queue, _OUTCOMES.get(result, "other")).inc()
    QUEUE_ATTEMPT_DURATION.labels(queue).observe(attempt_seconds)
    answered = clock.now_ms() if answered_ms is None else answered_ms
    due = getattr(row, "due_at", None)
    if due is None and row.attempt == 0 and row.deliveries <= 1:
        due = row.enqueued_at
    if due is not None:
        QUEUE_DELIVERY_LATENCY.labels(queue).observe(max(0.0, (answered - due) / 1000))


# --------------------------------------------------------------------------- scrape-time gauges


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


class DatabaseCollector:
    """Gauges read from the database at scrape time (docs/operations.md "Metrics").

    Every query is an index(-only) scan: pending messages through the partial
    index ``queue_message_due``, in-flight ones through ``queue_message_inflight``
    (both bounded per shard by ``METRICS_COUNT_CAP``, default 100 000: a count
    at the cap means "at least"), dead letters through ``queue_deadletter_message``
    (same cap), the most overdue alarm through the ``alarm_at`` index, active runs
    (``pending``/``running``) through ``cells_run_status_idx``. Completed, failed
    and cancelled runs grow without bound, so they are not counted per scrape:
    ``worldcell_runs_rows_estimate`` gives PostgreSQL's row estimate of the table.
    """

    def collect(self) -> Iterable[GaugeMetricFamily]:
        from cells.models import Run
        from queueing.models import DeadLetter, Message, QueueCell

        build = GaugeMetricFamily("worldcell_build_info", "worldcell build", labels=["version", "python", "django"])
        import django

        build.add_metric([_version(), platform.python_version(), django.get_version()], 1)
        yield build

        cap = int(getattr(settings, "METRICS_COUNT_CAP", 100_000))
        shown = int(getattr(settings, "METRICS_SHARDS", 100))
        m, d, c = _table(Message), _table(DeadLetter), _table(QueueCell)
        pending = GaugeMetricFamily("worldcell_queue_pending", "Messages due or waiting, per shard (capped)", labels=["shard"])
        inflight = GaugeMetricFamily("worldcell_queue_inflight", "Messages claimed and being delivered, per shard", labels=["shard"])
        dead = GaugeMetricFamily("worldcell_queue_dead_letters", "Dead letters, per shard (capped)", labels=["shard"])
        # one query for every cell, each count still an index scan bounded by the cap
        with connection.cursor() as cursor:
            cursor.execute(
                f'SELECT c."name", '
                f'(SELECT COUNT(*) FROM (SELECT 1 FROM {m} WHERE "cell_id" = c."id" AND "due_at" IS NOT NULL LIMIT %s) AS p), '
                f'(SELECT COUNT(*) FROM (SELECT 1 FROM {m} WHERE "cell_id" = c."id" AND "inflight_deadline" IS NOT NULL LIMIT %s) AS i), '
                f'(SELECT COUNT(*) FROM (SELECT 1 FROM {d} WHERE "cell_id" = c."id" LIMIT %s) AS d) '
                f'FROM {c} AS c',
                [cap, cap, cap],
            )
            rows = cursor.fetchall()
        # the busiest METRICS_SHARDS cells by name, the rest summed under shard="other"
        rows.sort(key=lambda r: (-(r[1] + r[2] + r[3]), r[0]))
        rest = [0, 0, 0]
        for name, p, i, n in rows[shown:]:
            rest[0] += p
            rest[1] += i
            rest[2] += n
        for name, p, i, n in rows[:shown]:
            pending.add_metric([name], p)
            inflight.add_metric([name], i)
            dead.add_metric([name], n)
        if len(rows) > shown:
            pending.add_metric(["other"], rest[0])
            inflight.add_metric(["other"], rest[1])
            dead.add_metric(["other"], rest[2])
        yield pending
        yield inflight
        yield dead

        first = QueueCell.objects.filter(alarm_at__isnull=False).order_by("alarm_at").values_list("alarm_at", flat=True).first()
        overdue = GaugeMetricFamily(
            "worldcell_queue_alarm_overdue_seconds", "How late the most overdue queue alarm is (s; 0 = none overdue)"
        )
        overdue.add_metric([], max(0.0, (clock.now_ms() - first) / 1000) if first is not None else 0.0)
        yield overdue

        runs = GaugeMetricFamily("worldcell_runs", "Active runs by status", labels=["status"])
        counts = dict.fromkeys(("pending", "running"), 0)
        for status, n in Run.objects.filter(status__in=list(counts)).values_list("status").annotate(n=_count()).order_by():
            counts[status] = n
        for status, n in counts.items():
            runs.add_metric([status], n)
        yield runs
        if connection.vendor == "postgresql":
            est = GaugeMetricFamily("worldcell_runs_rows_estimate", "PostgreSQL's estimate of the number of runs (all statuses)")
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [Run._meta.db_table])
                row = cursor.fetchone()
            est.add_metric([], max(0.0, float(row[0])) if row else 0.0)
            yield est


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("worldcell")
    except PackageNotFoundError:
        return "unknown"


def _count():
    from django.db.models import Count

    return Count("*")


# --------------------------------------------------------------------------- exposition


def registry() -> CollectorRegistry:
    """A registry for one scrape: the recorded metrics (all processes in multiprocess mode) + the database gauges."""
    reg = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(reg)
    else:
        reg.register(_Recorded())
    reg.register(DatabaseCollector())
    return reg


class _Recorded:
    """This process's own recorded metrics (single-process mode)."""

    def collect(self):
        return REGISTRY.collect()


def serve_worker_metrics() -> int | None:
    """Start the Celery worker's metrics HTTP server on ``WORLDCELL_WORKER_METRICS_PORT``; its port, or None.

    It serves the recorded metrics of this process only (no database gauges:
    the API's ``/metrics`` has those), bound to ``WORLDCELL_WORKER_METRICS_HOST``
    (default 127.0.0.1). A port already in use is logged, not fatal.
    """
    import logging

    port = int(getattr(settings, "WORKER_METRICS_PORT", 0) or 0)
    if not port or not ENABLED:
        return None
    from prometheus_client import start_http_server

    reg = REGISTRY
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        reg = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(reg)
    try:
        start_http_server(port, addr=settings.WORKER_METRICS_HOST, registry=reg)
    except OSError as exc:
        logging.getLogger("worldcell.metrics").error("worker metrics: cannot listen on port %d: %s", port, exc)
        return None
    return port


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return True
    header = request.META.get("HTTP_AUTHORIZATION", "")
    return header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode())


def view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the Prometheus text format; 401 without the token when ``METRICS_TOKEN`` is set."""
    if not settings.METRICS_ENABLED:
        return HttpResponse(b'{"error":{"name":"NotFound","message":"metrics are disabled"}}', status=404,
                            content_type="application/json")
    if not _authorized(request):
        response = HttpResponse(b'{"error":{"name":"Unauthorized","message":"metrics token required"}}', status=401,
                                content_type="application/json")
        response["WWW-Authenticate"] = "Bearer"
        return response
    started = time.perf_counter()
    body = generate_latest(registry())
    body += b"# HELP worldcell_scrape_duration_seconds Time to build this scrape (s)\n"
    body += b"# TYPE worldcell_scrape_duration_seconds gauge\n"
    body += f"worldcell_scrape_duration_seconds {time.perf_counter() - started:.6f}\n".encode()
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
