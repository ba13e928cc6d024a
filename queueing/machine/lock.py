"""The cell lock and the alarm rules of docs/protocol.md §7.8 (``armAlarmAtMost``, ``scheduleNextAlarm``).

Every transition locks its cell's ``QueueCell`` row first (``_lock_cell``)
and ends with the alarm rule the spec names; ``_wake_after_commit`` registers
the driver wake-up for when the transaction is durable.

The alarm rules are pure functions here (``soon``, ``next_alarm``,
``armed``), used by the Python path; the one-trip scripts state the same
rules as SQL fragments (``machine.sql.soon`` / ``armed``), and
``tests/queueing/test_queue_rules.py`` checks the two against each other.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from worldcell import clock

from .. import config, wake
from ..models import QueueCell
from . import db, sql

__all__ = ["arm_alarm_at_most", "armed", "next_alarm", "schedule_next_alarm", "soon"]


# --------------------------------------------------------------------------- the rules (pure)


def soon(t: int | None, now: int) -> int | None:
    """``t``, or ``now + 1`` when ``t ≤ now`` (an overdue time re-arms just ahead, §7.8); None stays None."""
    if t is None:
        return None
    return now + config.MIN_ALARM_DELAY_MS if t <= now else t


def next_alarm(first_due: int | None, first_deadline: int | None, now: int) -> int | None:
    """The alarm ``scheduleNextAlarm`` sets: ``soon`` of the earlier of the two, None if neither (§7.8)."""
    candidates = [t for t in (first_due, first_deadline) if t is not None]
    return soon(min(candidates), now) if candidates else None


def armed(current: int | None, target: int, now: int) -> int:
    """The alarm after ``armAlarmAtMost(target)`` (§7.8): overdue -> ``now + 1``, else the earlier of it and ``soon(target)``."""
    if current is not None and current <= now:
        return now + config.MIN_ALARM_DELAY_MS
    t = soon(target, now)
    return t if current is None or t < current else current


# --------------------------------------------------------------------------- the cell lock


def _cell_from_row(row: tuple) -> QueueCell:
    pk, name, shards, pinned_at, alarm_at = row
    return QueueCell(id=pk, name=name, queue_shards=shards, pinned_at=pinned_at, alarm_at=alarm_at)


def _lock_cell(
    name: str | None = None, *, pk: int | None = None, create: bool = False, skip_locked: bool = False
) -> QueueCell | None:
    """Lock and return the cell row named ``name`` (or with id ``pk``) inside the current transaction.

    One statement (``SELECT … FOR UPDATE``). ``create=True`` inserts it when
    missing (a savepoint absorbs the insert race with a concurrent creator).
    Returns None when the cell does not exist (and ``create`` is false) or,
    with ``skip_locked``, when another transaction holds it.
    """
    statement = (sql.CELL_BY_ID if pk is not None else sql.CELL_BY_NAME) + db.lock_clause(skip_locked)
    found = db.rows(statement, [pk if pk is not None else name])
    if found:
        return _cell_from_row(found[0])
    if not create or name is None:
        return None
    try:
        with transaction.atomic():
            return QueueCell.objects.create(name=name)
    except IntegrityError:
        return _cell_from_row(db.rows(sql.CELL_BY_NAME + db.lock_clause(False), [name])[0])


def _set_alarm(cell: QueueCell, alarm_at: int | None) -> None:
    if cell.alarm_at != alarm_at:
        db.rowcount(sql.SET_ALARM, [alarm_at, cell.pk])
        cell.alarm_at = alarm_at


# --------------------------------------------------------------------------- alarm helpers (§7.8)


def arm_alarm_at_most(cell: QueueCell, target: int, now: int) -> None:
    """Arm the cell's alarm no later than ``target`` (enqueue, redrive; docs/protocol.md §7.8).

    An alarm that is already overdue (``≤ now``) moves to ``now + 1``;
    otherwise the alarm becomes ``max(target, now + 1)`` if that is earlier
    than the current one (or there is none). Writes only when it changes.
    """
    _set_alarm(cell, armed(cell.alarm_at, target, now))


def schedule_next_alarm(cell: QueueCell, now: int) -> int | None:
    """Set the alarm to the earliest due time or in-flight deadline (docs/protocol.md §7.8).

    Overdue work gives ``now + 1``; no work at all clears the alarm.
    Returns the new alarm (epoch ms or None). One query + a write if changed.
    """
    [(due, deadline)] = db.rows(sql.NEXT_ALARM_INPUTS, [cell.pk, cell.pk])
    _set_alarm(cell, next_alarm(due, deadline, now))
    return cell.alarm_at


def _wake_after_commit(cell: QueueCell, now: int) -> None:
    """Register the driver wake-up for when this transaction commits (docs/architecture.md rule 6).

    Every transaction that locks a cell registers it, whatever its outcome,
    with the alarm as it stands at commit: a wake-up that found the cell
    locked (and skipped it) relies on the lock holder to wake the cell again.
    (One exception, ``enqueue`` into a cell whose in-flight slots are all
    taken, is explained there.)
    """
    transaction.on_commit(lambda: wake.after_transition(cell.name, cell.alarm_at, now), robust=True)


def _lock_and_wake(cell_name: str, now: int | None) -> tuple[QueueCell | None, int]:
    """An operator transition's start: lock the cell, read ``now`` (unless given), wake the cell on commit.

    Returns ``(None, now)`` for a cell that was never written (nothing locked,
    no wake-up). Must run inside the transition's ``transaction.atomic()``.
    """
    cell = _lock_cell(cell_name)
    if cell is None:
        return None, 0 if now is None else now
    now = clock.now_ms() if now is None else now
    _wake_after_commit(cell, now)
    return cell, now
