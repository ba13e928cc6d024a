"""Liveness and readiness probes (docs/operations.md "Health").

``GET /healthz/live`` answers ``{"ok":true}`` without touching anything: the
process serves requests. ``GET /healthz/ready`` runs every check below, each
in its own thread with ``HEALTH_CHECK_TIMEOUT_S`` (default 2 s), and answers
200 when all pass, else 503, with::

    {"ok": false, "checks": {"database": {"ok": true, "ms": 1.2}, "broker": {"ok": false, "ms": 2000.0,
     "error": "timed out after 2.0 s"}, ...}}

Checks: ``database`` (``SELECT 1``), ``migrations`` (every migration on disk
is recorded as applied), ``alarms`` (the most overdue queue alarm is younger
than ``HEALTH_ALARM_MAX_OVERDUE_S``); with Celery as the driver ``broker``
(a connection to ``CELERY_BROKER_URL``) and ``beat`` (beat's last tick,
recorded by ``fire_due_alarms`` through ``record_beat()``, is younger than
``HEALTH_BEAT_MAX_AGE_S``); without Celery ``pump`` (this process's alarm
pump is running and ticked recently). Error texts name the failure class,
never a URL or a password. ``/v1/health`` is the protocol's constant answer
and stays separate (docs/protocol.md §2.3).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse

from . import clock

log = logging.getLogger("worldcell.health")

__all__ = ["live", "ready", "readiness", "record_beat"]

BEAT = "beat"


def record_beat(name: str = BEAT, now_ms: int | None = None) -> None:
    """Record that periodic process ``name`` ticked now (one UPDATE, an INSERT the first time).

    Never raises: a heartbeat that cannot be written shows up as a stale tick.
    """
    from .models import Heartbeat

    at = clock.now_ms() if now_ms is None else now_ms
    try:
        if not Heartbeat.objects.filter(name=name).update(at_ms=at):
            Heartbeat.objects.get_or_create(name=name, defaults={"at_ms": at})
    except Exception as exc:  # noqa: BLE001 - readiness reports the stale tick
        log.warning("could not record the %s heartbeat: %s", name, type(exc).__name__)


# --------------------------------------------------------------------------- checks
# Each check returns None when healthy, or a short error text; it may raise.


def _check_database() -> str | None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return None


_migration_nodes: set[tuple[str, str]] | None = None


def _check_migrations() -> str | None:
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    global _migration_nodes
    connection = connections["default"]
    if _migration_nodes is None:  # the files on disk do not change while the process runs
        _migration_nodes = set(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    applied = set(MigrationRecorder(connection).applied_migrations())
    missing = sorted(f"{app}.{name}" for app, name in _migration_nodes - applied)
    if missing:
        return f"{len(missing)} migration(s) not applied: {', '.join(missing[:5])}"
    return None


def _check_alarms() -> str | None:
    from queueing.models import QueueCell

    first = QueueCell.objects.filter(alarm_at__isnull=False).order_by("alarm_at").values_list("alarm_at", flat=True).first()
    if first is None:
        return None
    overdue_s = (clock.now_ms() - first) / 1000
    if overdue_s > settings.HEALTH_ALARM_MAX_OVERDUE_S:
        return f"a queue alarm is {overdue_s:.0f} s overdue (limit {settings.HEALTH_ALARM_MAX_OVERDUE_S:g} s)"
    return None


def _check_beat() -> str | None:
    from .models import Heartbeat

    at = Heartbeat.objects.filter(name=BEAT).values_list("at_ms", flat=True).first()
    if at is None:
        return "beat has never ticked (is celery beat running, and a worker?)"
    age_s = (clock.now_ms() - at) / 1000
    if age_s > settings.HEALTH_BEAT_MAX_AGE_S:
        return f"beat's last tick was {age_s:.0f} s ago (limit {settings.HEALTH_BEAT_MAX_AGE_S:g} s)"
    return None


def _check_broker() -> str | None:
    from kombu import Connection

    timeout = settings.HEALTH_CHECK_TIMEOUT_S
    with Connection(
        settings.CELERY_BROKER_URL, connect_timeout=timeout,
        transport_options={"socket_timeout": timeout, "socket_connect_timeout": timeout, "max_retries": 0},
    ) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
        conn.default_channel  # noqa: B018 - the Redis transport pings here
    return None


def _check_pump() -> str | None:
    from queueing import wake

    pump = wake.current_pump()
    if pump is None:
        return "no queue pump runs in this process (WORLDCELL_USE_CELERY=false needs manage.py devfleet)"
    loop = getattr(pump, "_loop", None)
    if loop is None or not loop.is_alive():
        return "the queue pump's tick thread has stopped"
    interval = float(getattr(pump, "interval_s", 1.0))
    age = time.monotonic() - float(getattr(pump, "_last_tick", 0.0))
    limit = max(5.0, 5 * interval)
    if age > limit:
        return f"the queue pump last ticked {age:.1f} s ago (limit {limit:g} s)"
    return None


def _checks() -> dict[str, Callable[[], str | None]]:
    checks: dict[str, Callable[[], str | None]] = {
        "database": _check_database,
        "migrations": _check_migrations,
        "alarms": _check_alarms,
    }
    if settings.WORLDCELL_USE_CELERY:
        checks["broker"] = _check_broker
        checks["beat"] = _check_beat
    else:
        checks["pump"] = _check_pump
    return checks


def _run_one(fn: Callable[[], str | None], out: dict[str, Any], uses_db: bool) -> None:
    started = time.perf_counter()
    try:
        error = fn()
    except Exception as exc:  # noqa: BLE001 - a failing dependency is a failed check
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}".rstrip(": ")
    finally:
        if uses_db:
            connections.close_all()  # this thread's connections die with it
    out["ms"] = round((time.perf_counter() - started) * 1000, 1)
    out["ok"] = error is None
    if error is not None:
        out["error"] = _redact(error)


def _redact(text: str) -> str:
    """Drop credentials a driver may quote in an error (``user:password@host``)."""
    import re

    return re.sub(r"//[^/@\s]*@", "//…@", text)


def readiness() -> tuple[bool, dict[str, dict[str, Any]]]:
    """Run every check concurrently, each bounded by ``HEALTH_CHECK_TIMEOUT_S``; ``(all ok, per-check results)``.

    A check still running at its timeout is reported ``ok: false`` with
    ``error: "timed out after N s"`` (its daemon thread is left to finish).
    """
    timeout = settings.HEALTH_CHECK_TIMEOUT_S
    results: dict[str, dict[str, Any]] = {}
    threads = []
    started = time.perf_counter()
    for name, fn in _checks().items():
        out: dict[str, Any] = {}
        results[name] = out
        t = threading.Thread(target=_run_one, args=(fn, out, name != "broker" and name != "pump"),
                             name=f"health-{name}", daemon=True)
        t.start()
        threads.append((name, t, out))
    for name, t, out in threads:
        t.join(max(0.0, timeout - (time.perf_counter() - started)))
        if "ok" not in out:
            results[name] = {"ok": False, "ms": round(timeout * 1000, 1), "error": f"timed out after {timeout:g} s"}
    ok = all(r["ok"] for r in results.values())
    return ok, results


def _json(data: Any, status: int) -> HttpResponse:
    import json

    response = HttpResponse(json.dumps(data, separators=(",", ":")), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


def live(request: HttpRequest) -> HttpResponse:
    """``GET /healthz/live``: 200 ``{"ok":true}`` while the process serves requests (touches nothing)."""
    return _json({"ok": True}, 200)


def ready(request: HttpRequest) -> HttpResponse:
    """``GET /healthz/ready``: 200 when every check passes, else 503; the body names each check."""
    ok, results = readiness()
    response = _json({"ok": ok, "checks": results}, 200 if ok else 503)
    if not ok:
        # one WARNING naming the failed checks instead of Django's "Service Unavailable" ERROR per probe
        response._has_been_logged = True
        log.warning("not ready: %s", ", ".join(f"{k} ({v.get('error')})" for k, v in results.items() if not v["ok"]))
    return response
