"""Operator repairs (docs/protocol.md §7.9; ``manage.py rearm_alarms``): stats, ``rearmAlarm``, ``rearm_cell``."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from worldcell import clock

from . import db, sql
from .lock import _lock_and_wake, _lock_cell, _wake_after_commit, schedule_next_alarm
from .values import RearmReport

__all__ = ["cell_stats", "rearm_alarm", "rearm_cell"]


def cell_stats(cell_name: str) -> dict[str, Any]:
    """``{"pending","inflight","deadLetters","alarmAt"}`` of a cell in one read (docs/protocol.md §7.9).

    ``pending`` counts scheduled messages, ``inflight`` claimed ones. A cell
    that was never written answers zeros and ``alarmAt: None``. Never locks.
    """
    rows = db.rows(sql.STATS, [cell_name])
    alarm_at, pending, inflight, dead = rows[0] if rows else (None, 0, 0, 0)
    return {"pending": pending, "inflight": inflight, "deadLetters": dead, "alarmAt": alarm_at}

def rearm_alarm(cell_name: str, now: int | None = None) -> dict[str, int | None]:
    """``scheduleNextAlarm(now)`` and report the alarm: ``{"alarmAt": ms|None}`` (§7.9).

    The operator's recovery hatch; the cell's driver is woken on commit when
    the alarm is due. A cell that was never written answers ``None``.
    """
    with transaction.atomic():
        cell, now = _lock_and_wake(cell_name, now)
        if cell is None:
            return {"alarmAt": None}
        schedule_next_alarm(cell, now)
    return {"alarmAt": cell.alarm_at}


def rearm_cell(cell_name: str, now: int | None = None, *, dry_run: bool = False) -> RearmReport | None:
    """Repair one cell's schedule (``manage.py rearm_alarms``).

    In one transaction: claims past their deadline become due now, the alarm
    is recomputed (``scheduleNextAlarm``), and the cell's driver is woken on
    commit. ``dry_run`` computes the same report and rolls back. Returns
    None for an unknown cell.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return None
        now = clock.now_ms() if now is None else now
        before = cell.alarm_at
        recovered = db.rowcount(sql.RECOVER, [now, now, cell.pk, now])
        schedule_next_alarm(cell, now)
        stats = cell_stats(cell_name)
        if dry_run:
            transaction.set_rollback(True)
        else:
            _wake_after_commit(cell, now)
    return RearmReport(
        name=cell_name,
        pending=stats["pending"],
        inflight=stats["inflight"],
        dead_letters=stats["deadLetters"],
        alarm_before=before,
        alarm_after=cell.alarm_at,
        recovered=recovered,
    )
