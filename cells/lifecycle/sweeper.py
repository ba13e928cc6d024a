"""The sweep: one retention tick — resume cleanups, expire the due runs, clean them, remove stragglers.

``sweep`` is what beat, the dev fleet's ticker and ``manage.py retention
--now`` call; ``due_runs`` finds the runs whose deadline has passed (two
index range scans), a lease (``LifecycleState``) keeps two sweeps from
running at once, and ``status`` reports the settings, the tombstones and the
last sweep (``manage.py retention``, the queue dashboard).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from worldcell import clock, codec, metrics
from worldcell import sql as wsql

from ..models import LifecycleState, RunTombstone
from . import cleanup
from .cleanup import _RN, _Budget, _delete_queue_rows, clean_runs
from .expiry import expire_runs
from .policies import TERMINAL_STATUSES, Policy, policy, settle_ms
from .store import _CELL, _db_time, _rowcount, _rows

log = logging.getLogger("cells.lifecycle")

__all__ = ["LEASE_S", "SweepReport", "due_runs", "status", "sweep"]

#: Seconds a sweep holds its lease (another sweep meanwhile does nothing).
LEASE_S = 300


@dataclass
class SweepReport:
    """What one sweep did (``sweep``); times in epoch ms, ``rate`` in runs/s."""

    started_at: int
    finished_at: int = 0
    enabled: bool = True
    busy: bool = False
    dry_run: bool = False
    expired: int = 0
    cleaned: int = 0
    resumed: int = 0
    waiting: int = 0
    stragglers: int = 0
    failed: int = 0
    more: bool = False
    candidates: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        seconds = max(0.001, (self.finished_at - self.started_at) / 1000)
        return round(self.expired / seconds, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "startedAt": self.started_at, "finishedAt": self.finished_at, "enabled": self.enabled,
            "busy": self.busy, "dryRun": self.dry_run, "expired": self.expired, "cleaned": self.cleaned,
            "resumed": self.resumed, "waiting": self.waiting, "stragglers": self.stragglers,
            "failed": self.failed, "more": self.more, "rate": self.rate,
        }


def due_runs(now: datetime, limit: int, pol: Policy | None = None) -> list[dict[str, Any]]:
    """Up to ``limit`` runs whose deadline has passed, not yet expired: ``{runId, status, expiresAt, reason}``.

    Two index range scans (``completed_at`` for terminal retention,
    ``created_at`` for the maximum age); each candidate's deadline is
    recomputed under its lock by ``expire_runs``.
    """
    pol = pol or policy()
    found: dict[str, dict[str, Any]] = {}
    select = (
        f'SELECT c."name", r."status", r."created_at", r."completed_at" FROM "{_RN}" r '
        f'JOIN "{_CELL}" c ON c."id" = r."cell_id" WHERE NOT c."expired" AND '
    )
    queries = []
    if pol.retention_ms is not None:
        cutoff = _db_time(now - timedelta(milliseconds=pol.retention_ms))
        queries.append((select + 'r."completed_at" <= %s AND r."status" IN (%s, %s, %s) ORDER BY r."completed_at" LIMIT %s',
                        [cutoff, *TERMINAL_STATUSES, limit]))
    if pol.max_age_ms is not None:
        cutoff = _db_time(now - timedelta(milliseconds=pol.max_age_ms))
        queries.append((select + 'r."created_at" <= %s ORDER BY r."created_at" LIMIT %s', [cutoff, limit]))
    for sql, params in queries:
        for name, status_, created, completed in _rows(sql, params):
            due = pol.deadline(status_, codec.to_utc_ms(created), codec.to_utc_ms(completed) if completed else None)
            if due is None or due[0] > now:
                continue
            prev = found.get(name)
            if prev is None or due[0] < prev["expiresAt"]:
                found[name] = {"runId": name, "status": status_, "expiresAt": due[0], "reason": due[1]}
    return sorted(found.values(), key=lambda r: r["expiresAt"])[:limit]


def _take_lease(kind: str, now_ms: int) -> bool:
    LifecycleState.objects.get_or_create(kind=kind)
    return bool(
        _rowcount(
            f'UPDATE "{wsql.table(LifecycleState)}" SET "last_started_at" = %s '
            'WHERE "kind" = %s AND ("last_started_at" IS NULL OR "last_finished_at" >= "last_started_at" '
            'OR "last_started_at" < %s)',
            [now_ms, kind, now_ms - LEASE_S * 1000],
        )
    )


def _finish(kind: str, report: dict[str, Any], now_ms: int) -> None:
    LifecycleState.objects.filter(kind=kind).update(last_finished_at=now_ms, last_result=report)


def sweep(now: datetime | None = None, *, batch: int | None = None, dry_run: bool = False) -> SweepReport:
    """One retention sweep tick (beat, the dev fleet's ticker, ``manage.py retention --now``).

    Order: continue up to ``batch`` unfinished cleanups (oldest tombstone
    first; a run waiting for its settle pass takes no slot), then expire
    the due runs that fill the rest of ``batch`` (one fence transaction for
    all of them) and clean them, then delete up to ``PAGE`` queue messages/
    dead letters that arrived for already-expired runs. Bounded: at most
    ``batch`` (≤ 1000) runs and ``PAGES_PER_TICK`` pages of ≤ ``PAGE`` rows.
    ``report.more`` says a full batch was found (the caller may tick again at
    once). ``dry_run`` only lists the due runs (``report.candidates``) and
    writes nothing. A sweep that finds another one running (its lease) does
    nothing (``report.busy``). A failing page is logged and counted in
    ``report.failed``; the next sweep resumes.
    """
    pol = policy()
    now = now or clock.now()
    batch = min(1000, max(1, batch or pol.batch))
    report = SweepReport(started_at=clock.now_ms(), enabled=pol.enabled, dry_run=dry_run)
    if dry_run:
        report.candidates = due_runs(now, batch, pol) if pol.enabled else []
        report.finished_at = clock.now_ms()
        return report
    if not _take_lease("retention", report.started_at):
        report.busy = True
        report.finished_at = clock.now_ms()
        return report
    try:
        settling = now - timedelta(milliseconds=settle_ms())
        open_tombs = list(
            RunTombstone.objects.exclude(phase="done").exclude(phase="settle", tombstoned_at__gt=settling)
            .order_by("tombstoned_at").values_list("run_id", flat=True)[:batch]
        )
        expired: list[str] = []
        left = batch - len(open_tombs)
        if pol.enabled and left > 0:
            due = due_runs(now, left, pol)
            report.more = len(due) >= left
            try:
                expired = expire_runs([c["runId"] for c in due], now, pol=pol)
            except Exception:  # noqa: BLE001 - logged; nothing of the batch was fenced
                report.failed += len(due)
                log.exception("retention: expiring %d runs failed", len(due))
        else:
            report.more = len(open_tombs) >= batch
        report.expired = len(expired)
        metrics.record_expired(report.expired)
        if open_tombs or expired:
            try:
                cleaned, waiting = clean_runs(open_tombs + expired, now)
                report.cleaned, report.waiting = cleaned, waiting
            except Exception:  # noqa: BLE001 - logged; the next sweep resumes these runs
                report.failed += 1
                log.exception("retention: cleanup failed")
            report.resumed = len(open_tombs)
        report.stragglers = _delete_stragglers()
    finally:
        report.finished_at = clock.now_ms()
        _finish("retention", report.as_dict(), report.finished_at)
    return report


def _delete_stragglers() -> int:
    """Queue messages and dead letters that arrived for runs already expired (at most ``PAGE`` of each)."""
    from queueing.models import DeadLetter, Message

    total = 0
    for model in (Message, DeadLetter):
        table = wsql.table(model)
        runs = _rows(
            f'SELECT DISTINCT m."run_id" FROM "{table}" m JOIN "{_CELL}" c ON c."name" = m."run_id" '
            f'WHERE m."run_id" IS NOT NULL AND c."expired" LIMIT %s',
            [cleanup.PAGE],
        )
        if runs:
            tallies, _ = _delete_queue_rows([r for (r,) in runs], _Budget(4, 1.0))
            total += sum(n for kinds in tallies.values() for n in kinds.values())
    return total


def status() -> dict[str, Any]:
    """The settings, tombstone counts and last sweep (``manage.py retention``, the queue dashboard)."""
    pol = policy()
    state = LifecycleState.objects.filter(kind="retention").first()
    return {
        "retentionMs": pol.retention_ms,
        "maxAgeMs": pol.max_age_ms,
        "batch": pol.batch,
        "enabled": pol.enabled,
        "tombstones": RunTombstone.objects.count(),
        "cleaning": RunTombstone.objects.exclude(phase="done").count(),
        "lastStartedAt": state.last_started_at if state else None,
        "lastFinishedAt": state.last_finished_at if state else None,
        "lastResult": state.last_result if state else {},
    }
