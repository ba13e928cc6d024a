"""Liveness of the queue's drivers for the console: beat's tick and each pump's heartbeat (docs/queue-console.md).

Rows of ``worldcell.models.Heartbeat`` (written through
``worldcell.health.record_beat``): ``beat`` is touched by ``fire_due_alarms``
every second (so it says beat *and* a worker run); every ``LocalPump`` — one
per Celery worker process, one in ``devfleet`` — touches
``pump:<host>:<pid>`` from its tick thread at most every ``PUMP_EVERY_MS``
(one UPDATE per 5 s per process). ``drivers()`` reads them in one query;
``prune`` (the lifecycle tick) drops pumps silent for ``FORGET_AFTER_MS``.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

from worldcell import clock
from worldcell.health import BEAT, record_beat
from worldcell.models import Heartbeat

__all__ = ["PUMP_EVERY_MS", "drivers", "prune", "pump_name", "touch_pump"]

#: How often (ms) a pump records its heartbeat.
PUMP_EVERY_MS = 5_000
#: A pump heartbeat older than this (ms) shows as stale (three missed beats).
PUMP_STALE_MS = 3 * PUMP_EVERY_MS
#: Beat ticks every second; older than this (ms) it shows as stale (readiness uses HEALTH_BEAT_MAX_AGE_S).
BEAT_STALE_MS = 15_000
#: Pump rows silent this long (ms) are deleted: the process is gone.
FORGET_AFTER_MS = 24 * 3_600_000
PREFIX = "pump:"

_last_touch = {"pid": 0, "at": 0.0}


def pump_name() -> str:
    """This process's heartbeat name, ``pump:<host>:<pid>`` (at most 64 characters)."""
    pid = str(os.getpid())
    host = socket.gethostname()[: 64 - len(PREFIX) - len(pid) - 1]
    return f"{PREFIX}{host}:{pid}"


def touch_pump() -> None:
    """Record this process's pump heartbeat, at most once every ``PUMP_EVERY_MS``; never raises."""
    now = time.monotonic()
    if _last_touch["pid"] == os.getpid() and now - _last_touch["at"] < PUMP_EVERY_MS / 1000:
        return
    _last_touch.update(pid=os.getpid(), at=now)
    record_beat(pump_name())


def drivers(now: int | None = None) -> list[dict[str, Any]]:
    """Every heartbeat, beat first then pumps by name: ``{name, kind, at_ms, age_ms, stale}`` (one query)."""
    now = clock.now_ms() if now is None else now
    out = []
    for name, at in Heartbeat.objects.order_by("name").values_list("name", "at_ms"):
        kind = "beat" if name == BEAT else "pump" if name.startswith(PREFIX) else "other"
        limit = BEAT_STALE_MS if kind == "beat" else PUMP_STALE_MS
        out.append({"name": name, "kind": kind, "at_ms": at, "age_ms": max(0, now - at), "stale": now - at > limit})
    out.sort(key=lambda d: (d["kind"] != "beat", d["name"]))
    return out


def prune(now: int | None = None) -> int:
    """Delete pump heartbeats silent for ``FORGET_AFTER_MS``; how many."""
    now = clock.now_ms() if now is None else now
    return Heartbeat.objects.filter(name__startswith=PREFIX, at_ms__lt=now - FORGET_AFTER_MS).delete()[0]
