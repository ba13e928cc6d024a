"""Stuck-run repair: re-enqueue the workflow message of a run nothing will resume (docs/lifecycle.md).

A run is **stuck** when all of these hold (``find_stuck``):

* it is not terminal (``pending`` or ``running``) and not expired;
* no queue message names it (pending, scheduled for later, or in flight) —
  ``Message.run_id``, stored at enqueue;
* it is not durably parked: it has no live hook (a hook resumes it when
  someone calls it) and no wait whose ``resumeAt`` is still in the future;
* its last event is older than ``WORLDCELL_STUCK_RUN_AFTER`` (default 15 min).

``repair_run`` re-checks all of that in one transaction under the run cell's
lock (so a run that just got an event, a message or a terminal status is
left alone), records ``RunRepair(run, event sequence)`` — unique, so each
stuck state is repaired at most once, across any number of sweeps and
restarts — and enqueues, in the same transaction, the run's latest
workflow message (``FlowMessageRecord``) again under a new message id and
the idempotency key ``repair:<runId>:<event sequence>`` (``enqueue_once``,
which the console's *Re-enqueue* and *Wake up* share).

The queue's ``enqueue`` keeps that record, in the same transaction as every
stored ``__wkf_workflow_*`` message of a run (``queueing.service`` sets
``EnqueueRequest.record_flow``; ``queueing.machine`` writes it).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from worldcell import clock, codec
from worldcell import metrics
from worldcell import sql as wsql

from .models import Event, Hook, LifecycleState, Run, RunCellState
from .models.tombstone import FlowMessageRecord, RunRepair

log = logging.getLogger("cells.repair")

__all__ = ["ReconcileReport", "StuckRun", "enqueue_once", "find_stuck", "lock_run", "open_waits", "reconcile",
           "repair_run", "repairs_total"]

#: Runs examined per reconcile tick (keyset scan over run cells, resumed where the last tick stopped).
SCAN_BATCH = 500
_CELL = wsql.table(RunCellState)
_RN = wsql.table(Run)
_EV = wsql.table(Event)
_HK = wsql.table(Hook)

_repairs_lock = threading.Lock()
_repairs = 0


def repairs_total() -> int:
    """Repairs (re-enqueued workflow messages) made by this process."""
    return _repairs


def _count_repair() -> None:
    """Count one repair: this process's total and the ``worldcell_stuck_run_repairs`` metric."""
    global _repairs
    with _repairs_lock:
        _repairs += 1
    metrics.record_repair()


def threshold_ms() -> int | None:
    """``WORLDCELL_STUCK_RUN_AFTER`` in ms, None = repair off."""
    return getattr(settings, "WORLDCELL_STUCK_RUN_AFTER_MS", 15 * 60_000)


def _rows(statement: str, params: list[Any]) -> list[tuple]:
    """The rows of one statement (``worldcell.sql.rows``)."""
    return wsql.rows(wsql.database(), statement, params)


# =========================================================================== the record


# The record (``FlowMessageRecord``) is written by the queue's enqueue transition itself, in the
# message's own transaction (``queueing.machine``, ``EnqueueRequest.record_flow``).


# =========================================================================== finding stuck runs


@dataclass
class StuckRun:
    """A run found stuck: ``idle_since`` = epoch ms of its last event."""

    run_id: str
    cell_id: int
    status: str
    event_sequence: int
    idle_since: int
    repairable: bool = True
    reason: str = ""


def _last_event_ms(cell_id: int) -> int | None:
    rows = _rows(f'SELECT "created_at" FROM "{_EV}" WHERE "run_id" = %s ORDER BY "event_id" DESC LIMIT 1', [cell_id])
    return codec.epoch_ms(codec.to_utc_ms(rows[0][0])) if rows else None


def _has_message(run_id: str) -> bool:
    from queueing.models import Message

    return bool(_rows(f'SELECT 1 FROM "{wsql.table(Message)}" WHERE "run_id" = %s LIMIT 1', [run_id]))


def parked(cell_id: int, now_ms: int) -> str | None:
    """Why run cell ``cell_id`` is durably parked (``"open hook"``, ``"wait until …"``), or None.

    A wait is open from its ``wait_created`` until a ``wait_completed`` with
    the same ``correlationId``; it parks the run while its ``resumeAt`` is
    in the future (a due wait with no message is stuck).
    """
    if _rows(f'SELECT 1 FROM "{_HK}" WHERE "run_id" = %s LIMIT 1', [cell_id]):
        return "open hook"
    for resume_at in open_waits(cell_id).values():
        if hasattr(resume_at, "tzinfo") and codec.epoch_ms(resume_at) > now_ms:
            return f"wait until {codec.format_iso(resume_at)}"
    return None


def open_waits(cell_id: int) -> dict[str | None, Any]:
    """The open waits (sleeps) of run cell ``cell_id``: ``{correlationId: resumeAt}`` in log order.

    A wait is open from its ``wait_created`` until a ``wait_completed`` with
    the same ``correlationId`` (protocol.md §5.6); ``resumeAt`` is the
    ``wait_created`` event's (a datetime, or whatever the client sent, None
    when absent). Used by ``parked`` and the console's *Wake up*.
    """
    waits = _rows(
        f'SELECT "event_type", "correlation_id", "body" FROM "{_EV}" WHERE "run_id" = %s '
        f'AND "event_type" IN (%s, %s) ORDER BY "event_id"',
        [cell_id, "wait_created", "wait_completed"],
    )
    found: dict[str | None, Any] = {}
    for kind, corr, body in waits:
        if kind == "wait_created":
            found[corr] = (codec.decode(body).get("eventData") or {}).get("resumeAt")
        else:
            found.pop(corr, None)
    return found


def check(cell_id: int, run_id: str, status: str, sequence: int, now_ms: int, after_ms: int) -> StuckRun | None:
    """The run as a ``StuckRun`` if it is stuck now (see the module docstring), else None."""
    if status not in ("pending", "running"):
        return None
    last = _last_event_ms(cell_id)
    if last is None or now_ms - last < after_ms:
        return None
    if _has_message(run_id) or parked(cell_id, now_ms) is not None:
        return None
    stuck = StuckRun(run_id, cell_id, status, sequence, last)
    if not FlowMessageRecord.objects.filter(run_id=run_id).exists():
        stuck.repairable, stuck.reason = False, "no workflow message was ever recorded for it"
    elif RunRepair.objects.filter(run_id=run_id, event_sequence=sequence).exists():
        stuck.repairable, stuck.reason = False, "already repaired in this state"
    return stuck


def find_stuck(now_ms: int | None = None, *, limit: int = SCAN_BATCH, after_cell_id: int = 0,
               after_ms: int | None = None) -> tuple[list[StuckRun], int]:
    """Stuck runs among up to ``limit`` active runs with cell id > ``after_cell_id``; and the last id scanned.

    The scan is keyset-paged over active runs whose ``updated_at`` is older
    than the threshold (a cheap prefilter: a run's last event is never older
    than its ``updated_at``). Returns ``(stuck, last id)``; last id 0 = the
    scan reached the end.
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    after_ms = threshold_ms() if after_ms is None else after_ms
    if after_ms is None:
        return [], 0
    cutoff = connection.ops.adapt_datetimefield_value(codec.from_epoch_ms(now_ms - after_ms))
    rows = _rows(
        f'SELECT c."id", c."name", c."event_sequence", r."status" FROM "{_CELL}" c '
        f'JOIN "{_RN}" r ON r."cell_id" = c."id" WHERE c."id" > %s AND NOT c."expired" '
        f'AND r."status" IN (%s, %s) AND r."updated_at" <= %s ORDER BY c."id" LIMIT %s',
        [after_cell_id, "pending", "running", cutoff, limit],
    )
    stuck = [s for s in (check(cid, name, st, seq, now_ms, after_ms) for cid, name, seq, st in rows) if s]
    return stuck, (rows[-1][0] if len(rows) >= limit else 0)


# =========================================================================== repair


def _new_message_id(now_ms: int) -> str:
    """``msg_`` + a ULID (48-bit ms time, 80 random bits, Crockford base32), like the client's ids."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = (now_ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "msg_" + "".join(alphabet[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def repair_key(run_id: str, sequence: int) -> str:
    """The repair message's idempotency key: stable for (run, event sequence)."""
    return f"repair:{run_id}:{sequence}"


def _lock(run_id: str) -> tuple | None:
    """Lock run cell ``run_id`` (``FOR UPDATE OF`` the cell row on PostgreSQL); ``(id, sequence, expired, status)``."""
    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    rows = _rows(f'SELECT "id", "event_sequence", "expired" FROM "{_CELL}" WHERE "name" = %s{lock}', [run_id])
    if not rows:
        return None
    # read after the lock is granted (a fresh snapshot: whatever the last holder committed)
    status = _rows(f'SELECT "status" FROM "{_RN}" WHERE "cell_id" = %s', [rows[0][0]])
    return (*rows[0], status[0][0] if status else None)


#: Test hook: called between finding a run stuck and locking it for the repair.
_before_lock = None


def repair_run(stuck: StuckRun, now_ms: int | None = None, *, after_ms: int | None = None) -> str | None:
    """Re-enqueue the workflow message of ``stuck`` if it is still stuck in the same state; its message id.

    One transaction under the run cell's lock: re-check, insert
    ``RunRepair``, enqueue. Returns None (and changes nothing) when the run
    moved on (another event, a message, terminal, expired), is parked, has
    no recorded workflow message, or this state was already repaired.
    Raises nothing for those; a failing enqueue (e.g. CONFIG_MISMATCH) is
    logged and returns None. The re-enqueue itself is ``enqueue_once``.
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    after_ms = threshold_ms() if after_ms is None else after_ms
    if after_ms is None:
        return None
    if _before_lock is not None:
        _before_lock(stuck)
    with transaction.atomic():
        locked = _lock(stuck.run_id)
        if locked is None:
            return None
        cell_id, sequence, expired, status = locked
        if expired or sequence != stuck.event_sequence:
            return None
        if check(cell_id, stuck.run_id, status, sequence, now_ms, after_ms) is None:
            return None
        message_id, why = enqueue_once(stuck.run_id, sequence, now_ms, idle_since=stuck.idle_since)
        if message_id is None:
            if why.startswith("the queue refused"):
                log.error("repair of run %s: %s", stuck.run_id, why)
            return None
    _count_repair()
    log.info("repaired stuck run %s (event %d, idle since %d): message %s", stuck.run_id, sequence,
             stuck.idle_since, message_id)
    return message_id


class _EnqueueRefused(Exception):
    """Rolls back ``enqueue_once``'s savepoint when the queue refuses the message."""


def enqueue_once(run_id: str, sequence: int, now_ms: int, *, idle_since: int) -> tuple[str | None, str]:
    """Enqueue run ``run_id``'s recorded workflow message once for its state ``sequence``; ``(message id, "")``.

    THE re-enqueue rule, shared by stuck-run repair (``repair_run``) and the
    console's *Re-enqueue* and *Wake up* (``cells.operator_actions``). The
    caller holds the run cell's lock (``lock_run``) in its transaction and
    has checked the run. In a savepoint: insert ``RunRepair(run, sequence)``
    — unique, so a state is re-enqueued at most once, by anyone — then
    enqueue the run's ``FlowMessageRecord`` (queue, body, pinned target and
    shard count as the app sent it) under a fresh message id and the
    idempotency key ``repair_key(run, sequence)``.

    Args:
        run_id: the run; sequence: its current event sequence number.
        now_ms: epoch ms; idle_since: epoch ms recorded as "stuck since".

    Returns ``(None, why)`` and changes nothing when no workflow message was
    ever recorded for the run, this state was re-enqueued already (``why``
    names that message), or the queue refused (CONFIG_MISMATCH, RUN_EXPIRED).
    Database errors propagate.
    """
    from queueing import machine

    record = FlowMessageRecord.objects.filter(run_id=run_id).first()
    if record is None:
        return None, "no workflow message was ever recorded for it, so its queue and target are unknown"
    try:
        with transaction.atomic():
            RunRepair.objects.create(
                run_id=run_id, event_sequence=sequence, message_id="", queue_cell=record.queue_cell,
                idle_since=idle_since, repaired_at=now_ms,
            )
            request = machine.EnqueueRequest(
                message_id=_new_message_id(now_ms), queue_name=record.queue_name, pathname=record.pathname,
                body=codec.decode(record.body), target_base_url=record.target_base_url,
                queue_shards=record.queue_shards, idempotency_key=repair_key(run_id, sequence), run_id=run_id,
            )
            answer = machine.enqueue(record.queue_cell, request, now_ms)
            if not answer.get("ok"):
                raise _EnqueueRefused(f"the queue refused the message: {answer.get('code')}: {answer.get('message')}")
            RunRepair.objects.filter(run_id=run_id, event_sequence=sequence).update(message_id=answer["messageId"])
    except IntegrityError:
        done = RunRepair.objects.filter(run_id=run_id, event_sequence=sequence).values_list("message_id", flat=True)
        return None, f"already re-enqueued in this state (event {sequence}): message {done.first() or '?'}"
    except _EnqueueRefused as refused:
        return None, str(refused)
    return answer["messageId"], ""


def lock_run(run_id: str) -> tuple | None:
    """Lock run cell ``run_id`` in the current transaction; ``(cell id, event sequence, expired, status)`` or None.

    ``FOR UPDATE`` of the cell row on PostgreSQL (SQLite's IMMEDIATE
    transaction already serialises writers); the status is read after the
    lock is granted.
    """
    return _lock(run_id)


@dataclass
class ReconcileReport:
    """What one reconcile tick found and did; times in epoch ms."""

    started_at: int
    finished_at: int = 0
    scanned_to: int = 0
    stuck: list[StuckRun] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"startedAt": self.started_at, "finishedAt": self.finished_at, "stuck": len(self.stuck),
                "repaired": len(self.repaired), "dryRun": self.dry_run}


def reconcile(now_ms: int | None = None, *, dry_run: bool = False, limit: int = SCAN_BATCH,
              full: bool = False) -> ReconcileReport:
    """One reconcile tick: scan the next ``limit`` active runs (resuming the stored cursor), repair the stuck.

    ``full`` scans every active run from the start (``manage.py reconcile``).
    ``dry_run`` lists and repairs nothing (the cursor is not moved).
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    report = ReconcileReport(started_at=clock.now_ms(), dry_run=dry_run)
    if threshold_ms() is None:
        report.finished_at = clock.now_ms()
        return report
    state, _ = LifecycleState.objects.get_or_create(kind="reconcile")
    cursor = 0 if (full or dry_run) else state.cursor
    while True:
        stuck, last = find_stuck(now_ms, limit=limit, after_cell_id=cursor)
        report.stuck += stuck
        if not dry_run:
            for s in stuck:
                if s.repairable:
                    try:
                        mid = repair_run(s, now_ms)
                    except Exception:  # noqa: BLE001 - logged; the next tick tries again
                        log.exception("repair of run %s failed", s.run_id)
                        mid = None
                    if mid:
                        report.repaired.append(mid)
        cursor = last
        if not full or last == 0:
            break
    report.scanned_to = cursor
    report.finished_at = clock.now_ms()
    if not dry_run:
        LifecycleState.objects.filter(kind="reconcile").update(
            cursor=cursor, last_started_at=report.started_at, last_finished_at=report.finished_at,
            last_result=report.as_dict(),
        )
    return report


def stuck_since(run_id: str, now_ms: int | None = None) -> int | None:
    """Epoch ms since which run ``run_id`` is stuck (its last event), or None if it is not stuck (the console)."""
    now_ms = clock.now_ms() if now_ms is None else now_ms
    after_ms = threshold_ms()
    if after_ms is None:
        return None
    rows = _rows(
        f'SELECT c."id", c."event_sequence", r."status" FROM "{_CELL}" c JOIN "{_RN}" r ON r."cell_id" = c."id" '
        f'WHERE c."name" = %s AND NOT c."expired"',
        [run_id],
    )
    if not rows:
        return None
    found = check(rows[0][0], run_id, rows[0][2], rows[0][1], now_ms, after_ms)
    return found.idle_since if found else None
