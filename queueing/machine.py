"""The queue state machine: every transition of a queue cell, in one file (PROTOCOL.md §7).

A message lives in ``Message`` from enqueue until it is acked, dropped or
dead-lettered::

    enqueue ──> pending (due_at) ──claim──> in flight (inflight_deadline, claim_token)
                   ^    ^                        │
                   │    └── 503 {timeoutSeconds} ┤  (not counted, key kept)
                   │    └── counted retry ───────┤  attempt+1, backoff min(60, 2^attempt) s
                   │    └── deadline passed ─────┤  (lost claim recovered by the next alarm)
                   │                             ├── 2xx ─────────────> acked (row deleted)
                   │                             ├── 404/409/410/422 ─> dropped (row deleted)
                   └── redrive <── DeadLetter <──┘  attempt reaches QUEUE_MAX_ATTEMPTS

Rules every function here follows:

* each transition is ONE short transaction that first locks the cell's
  ``QueueCell`` row (``SELECT … FOR UPDATE``; on SQLite the IMMEDIATE
  transaction is the lock), reads ``now`` once and ends with the alarm helper
  the spec names (§7.8);
* outcomes of a delivery are applied only while the claim token still
  matches (compare-and-set), so a late or duplicated delivery task can never
  apply an outcome twice or touch a newer claim — except an ack (2xx) or a
  drop, which deletes the message whatever its claim state, as upstream's
  ack does (the application accepted it; a message is deleted only once);
* nothing here does network I/O; wake-ups of the driver (Celery or the
  in-process pump) are registered with ``transaction.on_commit`` so they
  happen only once the transition is durable (DESIGN.md rules 3 and 6);
* every transaction that held a cell's lock wakes the cell on commit when
  work is due, so a wake-up that finds the cell locked may simply skip it
  (``SKIP LOCKED``) — the lock holder will wake it again (an enqueue into a
  cell whose slots are all taken needs none: see ``enqueue_batch``);
* a delivery's outcome transaction may run the claim phase itself
  (``claim_next``) so a freed in-flight slot is refilled at once (§12 A14);
  while every slot is busy, alarm firings are skipped instead of polling.

Throughput (the cell lock is the bottleneck of a busy cell, so everything
that holds it is kept short):

* the delivery path's statements are fixed SQL text, not querysets;
* concurrent enqueues into a cell, and concurrent outcomes of its
  deliveries, from threads of one process are combined into one transaction
  (``queueing.combining``, ``enqueue_batch``, ``apply_outcomes``); an outcome
  transaction claims for all the slots it freed and marks the first claim of
  each delivery thread as started (``Claim.started``);
* on PostgreSQL the common enqueue and ack(+claim) transitions run as one
  ``BEGIN; …; COMMIT`` round trip (see "one-trip transitions" below), and
  outcome transactions commit without waiting for the WAL flush (see
  ``apply_outcomes``).

The one statement that runs without the cell lock is ``start_delivery``: a
single-row compare-and-set (``UPDATE … RETURNING``) that marks "the POST of
this claim has begun" so a duplicated delivery task cannot POST the same
claim twice.
"""
from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from django.db import IntegrityError, connection, transaction
from django.db.models import Q

from worldcell import clock, codec

from . import config, wake
from .combining import Combiner
from .models import DeadLetter, Message, QueueCell
from .runref import run_of_message

log = logging.getLogger("queueing.machine")

__all__ = [
    "Claim",
    "DeliveryRow",
    "EnqueueRequest",
    "RearmReport",
    "ack_message",
    "apply_outcome",
    "arm_alarm_at_most",
    "backoff_seconds",
    "cell_stats",
    "claim_due_messages",
    "dlq_key",
    "drop_message",
    "cell_alarms",
    "due_cell_names",
    "enqueue",
    "enqueue_batch",
    "fire_cell_alarm",
    "fire_due_alarms",
    "list_dead_letters",
    "ms13",
    "purge_dead_letters",
    "rearm_alarm",
    "rearm_cell",
    "redeliver_later",
    "redrive_dead_letter",
    "retry_message",
    "schedule_next_alarm",
    "start_delivery",
]

Dispatch = Callable[[list["Claim"]], None]


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated ``enqueue`` request (PROTOCOL.md §7.3); times in seconds as sent."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    queue_shards: int
    idempotency_key: str | None = None
    delay_seconds: float | None = None
    #: the run the body names (``cells.lifecycle.run_of_message``), stored on the row for retention
    run_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """One claimed message, handed from the claim transaction to a delivery.

    ``token`` identifies this claim; outcomes apply only while the message
    still carries it. ``as_task_args()`` / ``from_task_args()`` turn it into
    plain values for a Celery task.

    ``started`` is set on a claim whose POST was marked begun in the claim
    transaction itself (``claim_due_messages(start=n)``, used when
    the claiming thread delivers it next): its delivery skips
    ``start_delivery``. Such a claim must be delivered in this process — a
    copy sent to another worker would find its POST already begun and skip it.
    """

    cell_name: str
    cell_id: int
    message_pk: int
    message_id: str
    token: str
    started: "DeliveryRow | None" = field(default=None, compare=False, repr=False)

    def as_task_args(self) -> list[Any]:
        return [self.cell_name, self.cell_id, self.message_pk, self.message_id, self.token]

    @classmethod
    def from_task_args(cls, args: Iterable[Any]) -> "Claim":
        cell_name, cell_id, message_pk, message_id, token = args
        return cls(cell_name, int(cell_id), int(message_pk), message_id, token)


@dataclass(frozen=True)
class DeliveryRow:
    """The message as it was when its claim's delivery began (the "row" of §7.5–7.7)."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    idempotency_key: str | None
    attempt: int
    enqueued_at: int
    deliveries: int


#: The row argument of outcomes that do not read it (ack, drop, redeliver).
_NO_ROW = DeliveryRow("", "", "", "", "", None, 0, 0, 0)


@dataclass(frozen=True)
class RearmReport:
    """What ``rearm_cell`` found and changed on one cell (``manage.py rearm_alarms``)."""

    name: str
    pending: int
    inflight: int
    dead_letters: int
    alarm_before: int | None
    alarm_after: int | None
    recovered: int


# --------------------------------------------------------------------------- keys and times


def clamp_ms(ms: float) -> int:
    """Floor ``ms`` into ``[0, MAX_EPOCH_MS]`` (the ``ms13`` rule of §7.1, plus an upper bound).

    Total over floats: NaN and ``-inf`` (e.g. a 503 ``timeoutSeconds`` of
    ``-1e308`` times 1000) give 0 — "due now" — and ``+inf`` gives the bound.
    """
    if ms != ms or ms <= 0:  # NaN, negative (incl. -inf)
        return 0
    if ms >= config.MAX_EPOCH_MS:  # incl. +inf
        return config.MAX_EPOCH_MS
    return math.floor(ms)


def ms13(ms: float) -> str:
    """Epoch ms as the 13-digit key fragment of §7.1 (``max(0, floor(ms))``, zero-padded)."""
    return str(clamp_ms(ms)).zfill(13)


def dlq_key(failed_at: int, message_id: str) -> str:
    """The dead-letter key ``dlq:<ms13 failedAt>:<messageId>`` (also the P4 cursor, §4.0)."""
    return f"dlq:{ms13(failed_at)}:{message_id}"


def backoff_seconds(attempt: int) -> int:
    """Delay before the next try after ``attempt`` counted failures: ``min(60, 2^attempt)`` s (§7.7)."""
    return 60 if attempt >= 6 else 2**attempt


# --------------------------------------------------------------------------- fixed SQL
#
# The statements of the delivery path (enqueue, claim, start, outcome, alarm,
# stats) are fixed SQL text rather than ORM querysets: compiling a queryset
# costs far more CPU than running the statement (about 0.6 ms against 0.15 ms
# for a one-row lookup on the reference machine; 4-5 ms for the annotated
# stats query), and every cell transition runs several of them while it holds
# the cell's lock. The text is the same on PostgreSQL and SQLite (both quote
# with double quotes and support ``RETURNING`` and ``ON CONFLICT DO NOTHING``);
# only the row lock clause differs (SQLite's IMMEDIATE transaction is the
# lock). Statements go through Django's cursor, so transactions, on-commit
# hooks and ``execute_wrapper`` (the fault-injection tests) see them.

_M = Message._meta.db_table
_C = QueueCell._meta.db_table
_D = DeadLetter._meta.db_table

_CELL_COLUMNS = '"id", "name", "queue_shards", "pinned_at", "alarm_at"'
_CELL_BY_NAME = f'SELECT {_CELL_COLUMNS} FROM "{_C}" WHERE "name" = %s'
_CELL_BY_ID = f'SELECT {_CELL_COLUMNS} FROM "{_C}" WHERE "id" = %s'
_SET_ALARM = f'UPDATE "{_C}" SET "alarm_at" = %s WHERE "id" = %s'
_FIRST_DUE = f'SELECT "due_at" FROM "{_M}" WHERE "cell_id" = %s AND "due_at" IS NOT NULL ORDER BY "due_at" LIMIT 1'
_FIRST_DEADLINE = (
    f'SELECT "inflight_deadline" FROM "{_M}" WHERE "cell_id" = %s AND "inflight_deadline" IS NOT NULL '
    f'ORDER BY "inflight_deadline" LIMIT 1'
)
_INFLIGHT_COUNT = f'SELECT COUNT(*) FROM "{_M}" WHERE "cell_id" = %s AND "inflight_deadline" IS NOT NULL'
_NEXT_ALARM_INPUTS = f"SELECT ({_FIRST_DUE}), ({_FIRST_DEADLINE})"
_CLAIM_STATE = (
    f'SELECT 0, COUNT(*), MIN("inflight_deadline"), NULL FROM "{_M}" '
    f'WHERE "cell_id" = %s AND "inflight_deadline" IS NOT NULL '
    f'UNION ALL SELECT * FROM (SELECT 1, "id", "due_at", "message_id" FROM "{_M}" '
    f'WHERE "cell_id" = %s AND "due_at" IS NOT NULL ORDER BY "due_at", "message_id" LIMIT %s) AS "due"'
)
_RECOVER = (
    f'UPDATE "{_M}" SET "due_at" = %s, "inflight_deadline" = NULL, "claim_token" = NULL, '
    f'"delivery_started_at" = NULL, "updated_at" = %s WHERE "cell_id" = %s AND "inflight_deadline" <= %s'
)
_CID = 'c."id"'
_CELL_STATE = (
    f'SELECT c."alarm_at", ({_FIRST_DUE % _CID}), ({_FIRST_DEADLINE % _CID}), ({_INFLIGHT_COUNT % _CID}) '
    f'FROM "{_C}" c WHERE c."name" = %s'
)
_STATS = (
    f'SELECT c."alarm_at", '
    f'(SELECT COUNT(*) FROM "{_M}" WHERE "cell_id" = c."id" AND "due_at" IS NOT NULL), '
    f'({_INFLIGHT_COUNT % _CID}), '
    f'(SELECT COUNT(*) FROM "{_D}" WHERE "cell_id" = c."id") '
    f'FROM "{_C}" c WHERE c."name" = %s'
)
_INSERT_MESSAGES = (
    f'INSERT INTO "{_M}" ("cell_id", "message_id", "queue_name", "pathname", "body", "target_base_url", '
    f'"idempotency_key", "attempt", "enqueued_at", "due_at", "inflight_deadline", "claim_token", '
    f'"delivery_started_at", "deliveries", "last_error", "last_status", "last_attempt_at", "updated_at", "run_id") '
    f'VALUES %s ON CONFLICT DO NOTHING RETURNING "message_id", ({_INFLIGHT_COUNT.replace("%s", "%%s")})'
)
_INSERT_VALUES = "(%s, %s, %s, %s, %s, %s, %s, 0, %s, %s, NULL, NULL, NULL, 0, NULL, NULL, NULL, %s, %s)"
_DELIVERY_COLUMNS = (
    "message_id", "queue_name", "pathname", "body", "target_base_url", "idempotency_key",
    "attempt", "enqueued_at", "deliveries",
)
_DELIVERY_RETURNED = ", ".join(f'"{c}"' for c in _DELIVERY_COLUMNS)
_RETURN_DELIVERY = "RETURNING " + _DELIVERY_RETURNED
_CLAIM = (
    f'UPDATE "{_M}" SET "due_at" = NULL, "inflight_deadline" = %%s, "claim_token" = %%s, '
    f'"delivery_started_at" = NULL, "updated_at" = %%s WHERE "id" IN (%s)'
)
_CLAIM_AND_START = (
    f'UPDATE "{_M}" SET "due_at" = NULL, "inflight_deadline" = %%s, "claim_token" = %%s, '
    f'"delivery_started_at" = %%s, "last_attempt_at" = %%s, "deliveries" = "deliveries" + 1, "updated_at" = %%s '
    f'WHERE "id" IN (%s) RETURNING "id", {_DELIVERY_RETURNED}'
)
_START = (
    f'UPDATE "{_M}" SET "delivery_started_at" = %s, "last_attempt_at" = %s, "deliveries" = "deliveries" + 1, '
    f'"updated_at" = %s, "inflight_deadline" = %s WHERE "id" = %s AND "claim_token" = %s '
    f'AND "delivery_started_at" IS NULL AND "inflight_deadline" > %s {_RETURN_DELIVERY}'
)
_ACK_LATE = f'DELETE FROM "{_M}" WHERE "id" = %s AND "cell_id" = %s AND "message_id" = %s'
_REDELIVER = (
    f'UPDATE "{_M}" SET "due_at" = %s, "inflight_deadline" = NULL, "claim_token" = NULL, '
    f'"delivery_started_at" = NULL, "last_status" = %s, "updated_at" = %s WHERE "id" = %s AND "claim_token" = %s'
)
_RETRY = (
    f'UPDATE "{_M}" SET "attempt" = %s, "last_error" = %s, "last_status" = %s, "due_at" = %s, '
    f'"inflight_deadline" = NULL, "claim_token" = NULL, "delivery_started_at" = NULL, "updated_at" = %s '
    f'WHERE "id" = %s AND "claim_token" = %s'
)


def _rows(sql: str, params: list[Any] | tuple[Any, ...]) -> list[tuple]:
    """Run one fixed statement on the default connection; its rows (empty for none)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else []


def _rowcount(sql: str, params: list[Any] | tuple[Any, ...]) -> int:
    """Run one fixed write statement; the number of rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _lock_clause(skip_locked: bool) -> str:
    if not connection.features.has_select_for_update:
        return ""  # SQLite: the IMMEDIATE transaction already holds the database's write lock
    return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"


def _cell_from_row(row: tuple) -> QueueCell:
    pk, name, shards, pinned_at, alarm_at = row
    return QueueCell(id=pk, name=name, queue_shards=shards, pinned_at=pinned_at, alarm_at=alarm_at)


# --------------------------------------------------------------------------- cell lock


def _lock_cell(
    name: str | None = None, *, pk: int | None = None, create: bool = False, skip_locked: bool = False
) -> QueueCell | None:
    """Lock and return the cell row named ``name`` (or with id ``pk``) inside the current transaction.

    One statement (``SELECT … FOR UPDATE``). ``create=True`` inserts it when
    missing (a savepoint absorbs the insert race with a concurrent creator).
    Returns None when the cell does not exist (and ``create`` is false) or,
    with ``skip_locked``, when another transaction holds it.
    """
    sql = (_CELL_BY_ID if pk is not None else _CELL_BY_NAME) + _lock_clause(skip_locked)
    rows = _rows(sql, [pk if pk is not None else name])
    if rows:
        return _cell_from_row(rows[0])
    if not create or name is None:
        return None
    try:
        with transaction.atomic():
            return QueueCell.objects.create(name=name)
    except IntegrityError:
        return _cell_from_row(_rows(_CELL_BY_NAME + _lock_clause(False), [name])[0])


def _set_alarm(cell: QueueCell, alarm_at: int | None) -> None:
    if cell.alarm_at != alarm_at:
        _rowcount(_SET_ALARM, [alarm_at, cell.pk])
        cell.alarm_at = alarm_at


# --------------------------------------------------------------------------- alarm helpers (§7.8)


def arm_alarm_at_most(cell: QueueCell, target: int, now: int) -> None:
    """Arm the cell's alarm no later than ``target`` (enqueue, redrive; PROTOCOL.md §7.8).

    An alarm that is already overdue (``≤ now``) moves to ``now + 1``;
    otherwise the alarm becomes ``max(target, now + 1)`` if that is earlier
    than the current one (or there is none). Writes only when it changes.
    """
    current = cell.alarm_at
    if current is not None and current <= now:
        _set_alarm(cell, now + config.MIN_ALARM_DELAY_MS)
        return
    t = now + config.MIN_ALARM_DELAY_MS if target <= now else target
    if current is None or t < current:
        _set_alarm(cell, t)


def schedule_next_alarm(cell: QueueCell, now: int) -> int | None:
    """Set the alarm to the earliest due time or in-flight deadline (PROTOCOL.md §7.8).

    Overdue work gives ``now + 1``; no work at all clears the alarm.
    Returns the new alarm (epoch ms or None). One query + a write if changed.
    """
    [(due, deadline)] = _rows(_NEXT_ALARM_INPUTS, [cell.pk, cell.pk])
    _set_alarm(cell, _next_alarm(due, deadline, now))
    return cell.alarm_at


def _next_alarm(first_due: int | None, first_deadline: int | None, now: int) -> int | None:
    """The alarm ``scheduleNextAlarm`` sets: earliest of the two, ``now + 1`` if overdue, None if neither."""
    candidates = [t for t in (first_due, first_deadline) if t is not None]
    if not candidates:
        return None
    nxt = min(candidates)
    return now + config.MIN_ALARM_DELAY_MS if nxt <= now else nxt


def _wake_after_commit(cell: QueueCell, now: int) -> None:
    """Register the driver wake-up for when this transaction commits (DESIGN.md rule 6).

    Every transaction that locks a cell registers it, whatever its outcome,
    with the alarm as it stands at commit: a wake-up that found the cell
    locked (and skipped it) relies on the lock holder to wake the cell again.
    (One exception, ``enqueue`` into a cell whose in-flight slots are all
    taken, is explained there.)
    """
    transaction.on_commit(lambda: wake.after_transition(cell.name, cell.alarm_at, now), robust=True)


# --------------------------------------------------------------------------- enqueue (§7.3)


def _config_mismatch(pinned: int, got: int) -> dict[str, Any]:
    return {
        "ok": False,
        "code": "CONFIG_MISMATCH",
        "message": (
            f"queue cell shard-count mismatch: pinned {pinned}, got {got} "
            "\u2014 changing queueShards requires draining the fleet"
        ),
    }


def _holder_and_same(cell: QueueCell, message_id: str, key: str | None) -> tuple[tuple | None, tuple | None]:
    """The live message holding ``key`` and the live message with ``message_id`` (one query)."""
    cond = Q(message_id=message_id)
    if key:
        cond |= Q(idempotency_key=key)
    rows = list(Message.objects.filter(cell=cell).filter(cond).values_list("pk", "message_id", "idempotency_key"))
    holder = next((r for r in rows if key and r[2] == key), None)
    same = next((r for r in rows if r[1] == message_id), None)
    return holder, same


def _fresh_lifecycle(now: int) -> dict[str, Any]:
    """Column values of a message that starts over (enqueue overwrite, redrive)."""
    return dict(
        attempt=0,
        inflight_deadline=None,
        claim_token=None,
        delivery_started_at=None,
        deliveries=0,
        last_error=None,
        last_status=None,
        last_attempt_at=None,
        updated_at=now,
    )


def enqueue(cell_name: str, request: EnqueueRequest, now: int | None = None) -> dict[str, Any]:
    """Store one message in cell ``cell_name`` (PROTOCOL.md §7.3), one transaction.

    Order: pin ``queueShards`` on the first enqueue, else compare (mismatch ->
    ``{"ok":False,"code":"CONFIG_MISMATCH",…}``, checked before dedup); while
    a live message holds ``idempotency_key`` return it with ``deduped: True``
    (after ``scheduleNextAlarm``); else store the message due at
    ``now + max(0, delaySeconds) × 1000`` ms and ``armAlarmAtMost`` it.
    Re-enqueueing a live ``messageId`` without dedup overwrites it (attempt
    reset; an in-flight claim of it is voided — upstream's quirk of possible
    double delivery). Returns ``{"ok":True,"messageId":…,"deduped":bool}``.

    Concurrent enqueues into the same cell from threads of this process are
    combined (``queueing.combining``): one of them runs them all in one
    transaction, in arrival order, exactly as if each had run alone one after
    the other (``enqueue_batch``). Each caller still gets its own answer; a
    failed transaction fails each of them, and nothing of it is stored.
    Called inside an ``atomic`` block, or with an explicit ``now``, the
    enqueue runs alone.
    """
    if now is not None:
        return enqueue_batch(cell_name, [request], now)[0]
    return _enqueue_combiner.submit(cell_name, request)


def enqueue_batch(cell_name: str, requests: list[EnqueueRequest], now: int | None = None) -> list[dict[str, Any]]:
    """``enqueue`` of each request, in order, in ONE transaction on cell ``cell_name``; their answers.

    The common case — new ids, free keys — is three statements whatever the
    number of requests: lock the cell, one multi-row
    ``INSERT … ON CONFLICT DO NOTHING`` (which also counts the claims in
    flight), arm the alarm for the earliest due time. A request whose insert
    conflicts (a live holder of its key, a live message with its id) or that
    repeats an id or key of an earlier request of the batch is then decided
    on its own, in order, as ``enqueue`` describes. The outcome is that of
    running the requests one after the other.

    Wake-up on commit: only when an in-flight slot is free and the cell's
    alarm was not already due. While every slot is taken, a wake-up could
    claim nothing; the delivery that frees a slot claims the next due message
    in its own outcome transaction (which, being serialised after this one by
    the cell lock, sees these messages), and a slot held by a lost claim
    comes free through the alarm (beat / tick). An alarm that is already due
    means a claim phase is already on its way — the wake-up sent by the
    transition that made it due, the outcome of a delivery in flight, or the
    next beat — and it runs after this commit (a claim phase locks the cell;
    the pump retries a due cell it found locked a few ms later), so it sees
    these messages too. This saves a broker round trip per enqueue on a busy
    cell: a burst of enqueues sends one wake-up, not one each.

    On PostgreSQL, outside any transaction and with the clock read here, the
    batch first goes through ``_enqueue_in_one_trip``; only the requests it
    leaves undecided (conflicts, an unknown or unpinned cell, another shard
    count) then take the general path below, in a second transaction.
    """
    if now is None and _one_trip_enabled():
        decided = _enqueue_in_one_trip(cell_name, requests)
        if decided is not None:
            rest = [i for i, r in enumerate(decided) if r is None]
            if rest:
                for i, r in zip(rest, _enqueue_batch(cell_name, [requests[i] for i in rest], None)):
                    decided[i] = r
            return decided  # type: ignore[return-value]
    return _enqueue_batch(cell_name, requests, now)


def _enqueue_batch(cell_name: str, requests: list[EnqueueRequest], now: int | None) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(requests)
    with transaction.atomic():
        cell = _lock_cell(cell_name, create=True)
        now = clock.now_ms() if now is None else now
        alarm_before = cell.alarm_at
        if cell.queue_shards is not None:
            pinned = (cell.pk, cell.queue_shards)
            transaction.on_commit(lambda: _known_cells.__setitem__(cell_name, pinned))
        woken = False
        bulk: list[int] = []
        alone: list[int] = []
        seen: set[tuple[str, str]] = set()
        for i, request in enumerate(requests):
            if cell.queue_shards is None:
                QueueCell.objects.filter(pk=cell.pk).update(queue_shards=request.queue_shards, pinned_at=now)
                cell.queue_shards, cell.pinned_at = request.queue_shards, now
            elif cell.queue_shards != request.queue_shards:
                results[i] = _config_mismatch(cell.queue_shards, request.queue_shards)
                continue
            names = {("id", request.message_id)}
            if request.idempotency_key:
                names.add(("key", request.idempotency_key))
            (alone if names & seen else bulk).append(i)
            seen |= names
        if len(bulk) + len(alone) < len(requests):
            _wake_after_commit(cell, now)  # a mismatch held the lock too
            woken = True

        due: dict[int, int] = {}
        bodies: dict[int, str] = {}
        for i in bulk + alone:
            due[i] = clamp_ms(now + max(0, requests[i].delay_seconds or 0) * 1000)
            bodies[i] = codec.encode(requests[i].body)
        inflight = None
        if bulk:
            params: list[Any] = []
            for i in bulk:
                r = requests[i]
                params += [cell.pk, r.message_id, r.queue_name, r.pathname, bodies[i], r.target_base_url,
                           r.idempotency_key, now, due[i], now, r.run_id]
            sql = _INSERT_MESSAGES % ", ".join([_INSERT_VALUES] * len(bulk))
            rows = _rows(sql, params + [cell.pk])
            inserted = {mid for mid, _ in rows}
            inflight = rows[0][1] if rows else None
            earliest = None
            for i in bulk:
                if requests[i].message_id in inserted:
                    results[i] = {"ok": True, "messageId": requests[i].message_id, "deduped": False}
                    earliest = due[i] if earliest is None else min(earliest, due[i])
                else:
                    alone.append(i)
            if earliest is not None:
                arm_alarm_at_most(cell, earliest, now)
        if alone:
            if not woken:
                _wake_after_commit(cell, now)
                woken = True
            for i in sorted(alone):
                results[i] = _enqueue_alone(cell, requests[i], now, due[i], bodies[i])
        if not woken and inflight is not None and _enqueue_needs_wake(alarm_before, inflight, now):
            _wake_after_commit(cell, now)
    return results  # type: ignore[return-value]


def _enqueue_needs_wake(alarm_before: int | None, inflight: int, now: int) -> bool:
    """Whether new messages need a wake-up of the cell's driver (see ``enqueue_batch``)."""
    return inflight < config.max_inflight() and (alarm_before is None or alarm_before > now + config.MIN_ALARM_DELAY_MS)


def _enqueue_alone(cell: QueueCell, request: EnqueueRequest, now: int, due_at: int, body: str) -> dict[str, Any]:
    """Dedup / overwrite / store one request on a locked cell (the general case of §7.3 steps 2–3)."""
    holder, same = _holder_and_same(cell, request.message_id, request.idempotency_key or None)
    if holder is not None:
        schedule_next_alarm(cell, now)
        return {"ok": True, "messageId": holder[1], "deduped": True}
    fields = dict(
        queue_name=request.queue_name,
        pathname=request.pathname,
        body=body,
        target_base_url=request.target_base_url,
        idempotency_key=request.idempotency_key,
        enqueued_at=now,
        due_at=due_at,
        run_id=request.run_id,
        **_fresh_lifecycle(now),
    )
    if same is not None:
        Message.objects.filter(pk=same[0]).update(**fields)
    else:
        Message.objects.create(cell=cell, message_id=request.message_id, **fields)
    arm_alarm_at_most(cell, due_at, now)
    return {"ok": True, "messageId": request.message_id, "deduped": False}


# --------------------------------------------------------------------------- one-trip transitions (PostgreSQL)
#
# Every transition holds its cell's lock from the ``SELECT … FOR UPDATE`` to
# the commit. Run as separate statements from Python, that is several client
# round trips with the lock held, and on a loaded machine each of them waits
# for the holding thread to get the GIL and a CPU again: 10–25 ms of lock time
# for a three-statement enqueue, which serialises everything else on the cell.
# On PostgreSQL the hottest transitions are therefore sent as ONE
# multi-statement string ``BEGIN; …; COMMIT`` (simple query protocol, client-
# side parameter binding): the server takes the lock, does the work and
# commits without waiting for the client in between. The statements encode
# the same rules as the Python path (which SQLite and every other case keep
# using); the test suite runs against both.
#
# Two differences, both harmless: ``now`` is read just before the string is
# sent rather than after the lock is granted (a transition that waited for the
# lock uses a ``now`` up to that wait in the past, which only makes due times
# and alarms slightly earlier), and the batch is decided in SQL, so requests
# the fast path cannot decide on its own (conflicts, unknown cells) are
# returned undecided and go through the general path afterwards.

#: name -> (cell id, pinned shard count) of cells seen pinned in this process
#: (both never change once pinned; a stale entry only makes the fast path
#: decide nothing, because every statement re-checks id, name and pin).
_known_cells: dict[str, tuple[int, int]] = {}


def _one_trip_enabled() -> bool:
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _run_script(sql: str, params: list[Any]) -> list[list[tuple]]:
    """Run a ``BEGIN; …; COMMIT`` string in one round trip; the rows of each statement that returns rows.

    On any error the server's transaction is rolled back (nothing of it is
    committed) and the error propagates.
    """
    connection.ensure_connection()
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            results = []
            while True:
                if cursor.description is not None:
                    results.append(cursor.fetchall())
                if not cursor.nextset():
                    break
            return results
    except BaseException:
        raw = connection.connection
        if raw is not None and not raw.closed and raw.info.transaction_status != 0:  # not IDLE
            try:
                raw.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the connection is broken; Django replaces it
                connection.close()
        raise


_ONE_TRIP_VALUES = (
    "(%s::bigint, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, 0, %s::bigint, %s::bigint, "
    "NULL::bigint, NULL::varchar, NULL::bigint, 0, NULL::text, NULL::integer, NULL::bigint, %s::bigint, %s::text)"
)
_ONE_TRIP_ENQUEUE = (
    f'BEGIN; SET LOCAL synchronous_commit TO OFF; '
    f'SELECT "name", "queue_shards", "alarm_at" FROM "{_C}" WHERE "id" = %%s FOR UPDATE; '
    f'WITH "ins" AS (INSERT INTO "{_M}" ("cell_id", "message_id", "queue_name", "pathname", "body", '
    f'"target_base_url", "idempotency_key", "attempt", "enqueued_at", "due_at", "inflight_deadline", '
    f'"claim_token", "delivery_started_at", "deliveries", "last_error", "last_status", "last_attempt_at", '
    f'"updated_at", "run_id") SELECT * FROM (VALUES %s) AS "v" '
    f'WHERE EXISTS (SELECT 1 FROM "{_C}" WHERE "id" = %%s AND "name" = %%s AND "queue_shards" = %%s) '
    f'ON CONFLICT DO NOTHING RETURNING "message_id", "due_at"), '
    # armAlarmAtMost(min due of the inserted rows, now), §7.8
    f'"arm" AS (UPDATE "{_C}" SET "alarm_at" = CASE WHEN "alarm_at" IS NOT NULL AND "alarm_at" <= %%s '
    f'THEN %%s + {config.MIN_ALARM_DELAY_MS} ELSE LEAST(COALESCE("alarm_at", "t"."t"), "t"."t") END '
    f'FROM (SELECT CASE WHEN MIN("due_at") <= %%s THEN %%s + {config.MIN_ALARM_DELAY_MS} ELSE MIN("due_at") END '
    f'AS "t" FROM "ins") AS "t" WHERE "id" = %%s AND "t"."t" IS NOT NULL RETURNING "alarm_at") '
    f"SELECT COALESCE((SELECT array_agg(\"message_id\") FROM \"ins\"), '{{}}'), "
    f'(SELECT "alarm_at" FROM "arm"), ({_INFLIGHT_COUNT.replace("%s", "%%s")}); COMMIT; '
    # durability without the lock: this last statement is a transaction of its own that writes a WAL record
    # (a transactional logical message, available to every user at wal_level replica) and so commits
    # synchronously, waiting for the WAL flush up to its commit record -- past the commit above, whose
    # lock is already released. (A transaction that only took an id would not wait: PostgreSQL skips the
    # flush when its commit record is all it wrote.)
    f"SELECT pg_logical_emit_message(true, 'worldcell', 'enqueue')"
)


def _enqueue_in_one_trip(cell_name: str, requests: list[EnqueueRequest]) -> list[dict[str, Any] | None] | None:
    """The common case of ``enqueue_batch`` in one round trip; None when the cell is not known pinned here.

    Lock the cell, insert every request that does not repeat an earlier
    one's id or key (``ON CONFLICT DO NOTHING``), arm the alarm for the
    earliest inserted due time, count the claims in flight, commit — without
    waiting for the WAL flush, which the script's last statement then waits
    for with the cell's lock already released (a synchronous commit flushes
    every earlier asynchronous one with it): the client is told its message
    is stored only once it is durable, but the cell's lock is not held across
    a disk wait. (A delivery may read the message before that flush ends; a
    database crash in that instant loses an enqueue the client was never told
    succeeded — it retries — while the message may have been delivered:
    at least once, as always.) Returns one
    answer per request, None for those left undecided: a conflict with a live
    message, a repeated id or key, another shard count. Wakes the cell after
    the commit when an in-flight slot is free (see ``enqueue_batch``).
    """
    known = _known_cells.get(cell_name)
    if known is None:
        return None
    cell_id, shards = known
    now = clock.now_ms()
    decided: list[dict[str, Any] | None] = [None] * len(requests)
    bulk: list[int] = []
    seen: set[tuple[str, str]] = set()
    for i, r in enumerate(requests):
        if r.queue_shards != shards:
            continue
        names = {("id", r.message_id)}
        if r.idempotency_key:
            names.add(("key", r.idempotency_key))
        if not names & seen:
            bulk.append(i)
        seen |= names
    if not bulk:
        return decided
    params: list[Any] = [cell_id]
    for i in bulk:
        r = requests[i]
        due_at = clamp_ms(now + max(0, r.delay_seconds or 0) * 1000)
        params += [cell_id, r.message_id, r.queue_name, r.pathname, codec.encode(r.body), r.target_base_url,
                   r.idempotency_key, now, due_at, now, r.run_id]
    params += [cell_id, cell_name, shards, now, now, now, now, cell_id, cell_id]
    sql = _ONE_TRIP_ENQUEUE % ", ".join([_ONE_TRIP_VALUES] * len(bulk))
    locked, [(inserted, alarm_at, inflight)], _ = _run_script(sql, params)
    if [row[:2] for row in locked] != [(cell_name, shards)]:
        _known_cells.pop(cell_name, None)  # stale (the cell was deleted): the general path re-learns it
        return decided
    inserted = set(inserted)
    for i in bulk:
        if requests[i].message_id in inserted:
            decided[i] = {"ok": True, "messageId": requests[i].message_id, "deduped": False}
    if _enqueue_needs_wake(locked[0][2], inflight, now):
        wake.after_transition(cell_name, alarm_at, now)
    return decided


_enqueue_combiner: Combiner[EnqueueRequest, dict[str, Any]] = Combiner(
    lambda cell_name, requests: enqueue_batch(cell_name, requests)  # type: ignore[arg-type]
)


# --------------------------------------------------------------------------- alarm handler (§7.4)


def claim_due_messages(
    cell: QueueCell, now: int, limit: int | None = None, *, start: int = 0
) -> tuple[list[Claim], int]:
    """The claim phase of the alarm handler on a locked cell (PROTOCOL.md §7.4).

    1. claims whose deadline is ``≤ now`` are lost: their messages become due at ``now``;
    2. if fewer than ``QUEUE_MAX_INFLIGHT`` remain in flight, the earliest due
       messages (``due_at ≤ now``, by due time then message id) are claimed up
       to the free slots: deadline ``now + QUEUE_DELIVERY_TIMEOUT_MS + 30 000``,
       a fresh claim token — never more than ``limit`` when given (a driver
       with that many idle delivery threads; what is left stays due);
    3. ``scheduleNextAlarm(now)`` — computed from what steps 1–2 read: the
       schedule query fetches one row beyond the free slots, which is the
       earliest message left unclaimed.

    The first ``start`` claims have their POST marked begun in the statement
    that claims them (what ``start_delivery`` would do next) and carry the
    row to POST (``Claim.started``): the caller's delivery threads deliver
    them without another statement.

    Must run inside the transaction that locked ``cell``; typically three
    statements (in-flight count and due messages in one read, the claim, the
    alarm). Returns ``(claims, recovered_count)``.
    """
    cap = config.max_inflight() if limit is None else max(0, min(limit, config.max_inflight()))
    inflight, first_deadline, due_rows = _claim_state(cell, cap + 1)
    recovered = 0
    if first_deadline is not None and first_deadline <= now:
        recovered = _rowcount(_RECOVER, [now, now, cell.pk, now])
        inflight, first_deadline, due_rows = _claim_state(cell, cap + 1)
    free = min(cap, max(0, config.max_inflight() - inflight))
    take = [r for r in due_rows[:free] if r[2] <= now]
    claims: list[Claim] = []
    if take:
        token = uuid.uuid4().hex
        deadline = clamp_ms(now + config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS)
        begun, rest = take[:start], take[start:]
        if begun:
            ids = [pk for pk, _, _ in begun]
            returned = {
                r[0]: _delivery_row(r[1:])
                for r in _rows(_CLAIM_AND_START % ", ".join(["%s"] * len(ids)), [deadline, token, now, now, now, *ids])
            }
            claims += [Claim(cell.name, cell.pk, pk, mid, token, started=returned[pk]) for pk, mid, _ in begun]
        if rest:
            ids = [pk for pk, _, _ in rest]
            _rowcount(_CLAIM % ", ".join(["%s"] * len(ids)), [deadline, token, now, *ids])
            claims += [Claim(cell.name, cell.pk, pk, mid, token) for pk, mid, _ in rest]
        first_deadline = deadline if first_deadline is None else min(first_deadline, deadline)
    next_due = due_rows[len(take)][2] if len(due_rows) > len(take) else None
    _set_alarm(cell, _next_alarm(next_due, first_deadline, now))
    return claims, recovered


def _claim_state(cell: QueueCell, due_limit: int) -> tuple[int, int | None, list[tuple[int, str, int]]]:
    """``(claims in flight, earliest deadline, the first due_limit due messages)`` of a cell, one statement.

    Due messages are ``(pk, message_id, due_at)`` by due time then message id
    (sorted here as well: the order of ``UNION ALL`` branches is not promised;
    Python orders strings by code point, which is their UTF-8 byte order).
    """
    inflight, first_deadline = 0, None
    due: list[tuple[int, str, int]] = []
    for kind, a, b, mid in _rows(_CLAIM_STATE, [cell.pk, cell.pk, due_limit]):
        if kind == 0:
            inflight, first_deadline = a, b
        else:
            due.append((a, mid, b))
    due.sort(key=lambda r: (r[2], r[1]))
    return inflight, first_deadline, due


def _cell_state(cell_name: str) -> tuple[int | None, int | None, int | None, int] | None:
    """One unlocked read: ``(alarm_at, first due_at, first deadline, claims in flight)``, or None."""
    rows = _rows(_CELL_STATE, [cell_name])
    return rows[0] if rows else None


def fire_cell_alarm(
    cell_name: str,
    now: int | None = None,
    *,
    early_ms: int = 0,
    skip_locked: bool = False,
    dispatch: Dispatch | None = None,
    max_claims: int | None = None,
    on_locked: Callable[[], None] | None = None,
    start: int = 0,
) -> list[Claim]:
    """Run cell ``cell_name``'s alarm handler if its alarm is due (PROTOCOL.md §9.1, §7.4).

    The alarm is due when ``alarm_at ≤ now + early_ms``. Wake-ups pass
    ``early_ms=1``: overdue alarms are re-armed at ``now + 1`` only so that
    celld sees a fresh edge (§7.8); a wake treats that edge as due.

    Steps: (1) one unlocked read skips cells whose alarm is not due (keeping
    a countdown wake-up coming for a near alarm) and cells whose in-flight
    slots are all busy with unexpired claims; (2) one transaction locks the
    cell — with ``skip_locked`` it gives up when another transaction holds
    the lock (every lock holder wakes the cell again on commit) — reads
    ``now`` (unless given), re-checks the alarm and runs
    ``claim_due_messages``; (3) on commit, ``dispatch(claims)`` and a
    countdown wake-up for the next alarm. ``max_claims`` caps the claims
    (the in-process pump passes its idle delivery threads); ``on_locked()``
    is called when ``skip_locked`` gave up on a due cell (the pump then tries
    again a few ms later). The first ``start`` claims come back started
    (``Claim.started``): only for a caller that delivers them in this process.
    Returns the claims (empty when nothing was due or claimable).
    """
    fixed_now = now
    state = _cell_state(cell_name)
    # the clock is read after the read: an alarm that an enqueue re-armed to
    # its own now + 1 just before (§7.8) is then never "in the future" here
    now = clock.now_ms() if now is None else now
    if state is None:
        return []
    alarm_at, first_due, first_deadline, inflight = state
    if alarm_at is None or alarm_at > now + early_ms:
        wake.after_fire(cell_name, alarm_at, now)  # woken early: keep the next wake-up coming
        return []
    if (
        first_due is not None
        and first_due <= now
        and inflight >= config.max_inflight()
        and (first_deadline is None or first_deadline > now)
    ):
        # every in-flight slot is busy (upstream polls each millisecond here,
        # §7.4); the outcome that frees a slot refills it (§12 A14)
        return []
    with transaction.atomic():
        cell = _lock_cell(cell_name, skip_locked=skip_locked)
        if cell is None:
            if on_locked is not None:
                on_locked()
            return []
        now = clock.now_ms() if fixed_now is None else fixed_now
        if cell.alarm_at is None or cell.alarm_at > now + early_ms:
            _wake_after_commit(cell, now)
            return []
        claims, recovered = claim_due_messages(cell, now, max_claims, start=start)
        if recovered:
            log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell_name, recovered)
        if claims and dispatch is not None:
            transaction.on_commit(lambda: dispatch(claims), robust=True)
        name, new_alarm = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_fire(name, new_alarm, now), robust=True)
    return claims


def due_cell_names(at: int, *, limit: int = 10_000) -> list[str]:
    """Names of the cells whose alarm is ``≤ at``, longest-waiting (earliest alarm) first; one index scan."""
    return [name for name, _ in cell_alarms(at, limit=limit)]


_CELL_ALARMS = f'SELECT "name", "alarm_at" FROM "{_C}" WHERE "alarm_at" <= %s ORDER BY "alarm_at", "name" LIMIT %s'


def cell_alarms(at: int, *, limit: int = 10_000) -> list[tuple[str, int]]:
    """``(name, alarm_at)`` of the cells whose alarm is ``≤ at``, earliest alarm first; one index scan."""
    return _rows(_CELL_ALARMS, [at, limit])  # type: ignore[return-value]


def fire_due_alarms(now: int | None = None, *, dispatch: Dispatch | None = None, limit: int = 10_000) -> list[Claim]:
    """Fire every queue cell whose alarm is due (the beat task and the pump tick).

    Steps: (1) one index scan lists the cells with ``alarm_at ≤ now``;
    (2) each is fired in its own transaction with ``SKIP LOCKED`` on its row,
    so overlapping ticks or two beats never wait on each other and never
    claim the same message; (3) ``dispatch(claims)`` runs after each cell's
    commit. A failing cell is logged with its name and does not stop the
    others; its alarm stays due, so the next tick tries again.
    ``now`` defaults to the clock, read again for each cell. Returns all claims.
    """
    fixed_now = now
    names = due_cell_names(clock.now_ms() if now is None else now, limit=limit)
    claims: list[Claim] = []
    for name in names:
        try:
            claims += fire_cell_alarm(name, fixed_now, skip_locked=True, dispatch=dispatch)
        except Exception:  # noqa: BLE001 - one broken cell must not stop the others
            log.exception("queue cell %s: alarm handler failed; it stays due and is retried next tick", name)
    return claims


# --------------------------------------------------------------------------- delivery outcomes (§7.6, §7.7)


def start_delivery(claim: Claim, now: int | None = None) -> DeliveryRow | None:
    """Mark the POST of ``claim`` as begun and return the message to POST, or None.

    A single compare-and-set statement (``UPDATE … RETURNING``): it succeeds
    only while the message still carries this claim token, the POST of this
    claim has not begun yet and the claim's deadline has not passed. None
    means "skip": a duplicated or late delivery task, or a claim that was
    already recovered. Records ``last_attempt_at`` and counts the POST in
    ``deliveries``.

    The claim's deadline restarts here: ``now + QUEUE_DELIVERY_TIMEOUT_MS +
    30 000``. Time a claim spends waiting for a delivery thread (a busy
    Celery pool, the broker) therefore never eats into the time its POST may
    take, so a slow but timely answer is not raced by a redelivery. The
    cell's alarm may still name the claim-time deadline; firing then finds
    nothing lost and moves the alarm to the new one.
    """
    now = clock.now_ms() if now is None else now
    deadline = clamp_ms(now + config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS)
    rows = _rows(_START, [now, now, now, deadline, claim.message_pk, claim.token, now])
    return _delivery_row(rows[0]) if rows else None


def _delivery_row(row: tuple) -> DeliveryRow:
    mid, qname, pathname, body, base, key, attempt, enqueued_at, deliveries = row
    return DeliveryRow(mid, qname, pathname, codec.decode(body), base, key, attempt, enqueued_at, deliveries)


@dataclass(frozen=True)
class OutcomeRequest:
    """One classified delivery result to apply (``apply_outcome``'s arguments)."""

    claim: Claim
    row: DeliveryRow
    kind: str
    status: int | None = None
    reason: str | None = None
    timeout_seconds: float | None = None
    claim_next: bool | int = False


_OUTCOME_KINDS = ("ack", "drop", "redeliver", "retry")


def apply_outcome(
    claim: Claim,
    row: DeliveryRow,
    kind: str,
    *,
    status: int | None = None,
    reason: str | None = None,
    timeout_seconds: float | None = None,
    now: int | None = None,
    claim_next: bool | int = False,
) -> str | tuple[str, list[Claim]]:
    """Apply one classified delivery result (PROTOCOL.md §7.6) to the claimed message.

    ``kind`` is ``"ack"``, ``"drop"``, ``"redeliver"`` (needs ``timeout_seconds``)
    or ``"retry"`` (needs ``reason``). Returns what happened: ``"acked"``,
    ``"dropped"``, ``"redelivery scheduled"``, ``"retry scheduled"``,
    ``"dead-lettered"`` or ``"stale"`` (the claim was no longer current;
    nothing changed). With ``claim_next`` (True, or an integer cap > 0) the
    same transaction also runs the claim phase and the result is
    ``(what happened, new claims)`` — the first new claim already started
    (``Claim.started``); otherwise the cell's driver is woken on commit when
    work is due. Raises on database errors: the transaction rolled back and
    the claim stays in flight until its deadline (§7.7). ``now`` defaults to
    the clock read once the cell is locked.

    Outcomes of concurrent deliveries from the same cell in this process are
    combined into one transaction (``apply_outcomes``); with an explicit
    ``now``, or inside an ``atomic`` block, the outcome is applied alone.
    """
    if kind not in _OUTCOME_KINDS:
        raise ValueError(f"unknown delivery outcome {kind!r}")
    request = OutcomeRequest(claim, row, kind, status, reason, timeout_seconds, claim_next)
    if now is not None:
        result, claims = apply_outcomes(claim.cell_id, [request], now)[0]
    else:
        result, claims = _outcome_combiner.submit(claim.cell_id, request)
    return (result, claims) if claim_next else result


def apply_outcomes(
    cell_id: int, requests: list[OutcomeRequest], now: int | None = None
) -> list[tuple[str, list[Claim]]]:
    """Apply delivery results of claims of cell ``cell_id`` in ONE transaction; ``(what happened, new claims)`` each.

    Steps: lock the cell, read ``now`` (unless given); acks and drops of
    current claims are one ``DELETE``, everything else one statement each;
    then, when some applied outcome asked for ``claim_next``, one claim phase
    (§7.4) claims for all of them — the first claim of each is started for
    its delivery thread (``Claim.started``), further ones (within each
    request's cap) are handed to it unstarted — else ``scheduleNextAlarm``
    and a wake-up on commit. An outcome whose claim is no longer current is
    ``"stale"`` and changes nothing (a late ack excepted, see ``_ack_late``).

    On PostgreSQL the transaction commits without waiting for its WAL flush
    (``synchronous_commit = off``), so the cell's lock is released without a
    disk wait. Nothing a client was promised depends on it: should the
    database server crash within the flush delay, these outcomes are lost as
    if the worker had crashed after its POSTs — claims come back after their
    deadline and the messages are delivered again (at least once, never lost:
    enqueues and redrives commit synchronously, and a synchronous commit
    flushes every earlier asynchronous one with it).

    On PostgreSQL, outside any transaction and with the clock read here, the
    outcomes that ask for ``claim_next`` go through ``_outcomes_in_one_trip``
    (all but dead letters); everything else (and an outcome whose claim was
    no longer current) takes the general path below, in a second transaction.
    """
    if now is None and _one_trip_enabled():
        fast = [i for i, r in enumerate(requests) if _one_trip_outcome(r)]
        if fast:
            decided: list[tuple[str, list[Claim]] | None] = [None] * len(requests)
            for i, r in zip(fast, _outcomes_in_one_trip(cell_id, [requests[i] for i in fast])):
                decided[i] = r
            rest = [i for i, r in enumerate(decided) if r is None]
            if rest:
                for i, r in zip(rest, _apply_outcomes(cell_id, [requests[i] for i in rest], None)):
                    decided[i] = r
            return decided  # type: ignore[return-value]
    return _apply_outcomes(cell_id, requests, now)


def _apply_outcomes(
    cell_id: int, requests: list[OutcomeRequest], now: int | None
) -> list[tuple[str, list[Claim]]]:
    results: list[tuple[str, list[Claim]]] = [("stale", []) for _ in requests]
    with transaction.atomic():
        _commit_without_flush()
        cell = _lock_cell(pk=cell_id)
        if cell is None:
            return results
        now = clock.now_ms() if now is None else now
        applied = _apply(cell, requests, now)
        wanting: list[int] = []
        for i, label in enumerate(applied):
            if label is not None:
                results[i] = (label, [])
                if requests[i].claim_next:
                    wanting.append(i)
        if not wanting:
            if any(label is not None for label in applied):
                schedule_next_alarm(cell, now)
            _wake_after_commit(cell, now)
            return results
        caps = [None if requests[i].claim_next is True else int(requests[i].claim_next) for i in wanting]
        total = None if None in caps else sum(caps)
        claims, recovered = claim_due_messages(cell, now, total, start=len(wanting))
        if recovered:
            log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell.name, recovered)
        extra = _hand_out_claims(claims, [results[i][1] for i in wanting], caps)
        name, alarm_at = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_fire(name, alarm_at, now), robust=True)
        if len(wanting) < sum(label is not None for label in applied) or extra:
            _wake_after_commit(cell, now)  # a freed slot nobody refills here
    return results


def _hand_out_claims(claims: list[Claim], lists: list[list[Claim]], caps: list[int | None]) -> list[Claim]:
    """Give each requester (its claim list, its cap) one started claim, then the unstarted rest within caps.

    ``claims`` starts with the started ones (at most one per requester).
    Returns the claims nobody had room for (none when caps allow).
    """
    started = [c for c in claims if c.started is not None]
    extra = [c for c in claims if c.started is None]
    for lst, claim in zip(lists, started):
        lst.append(claim)
    for lst, cap in zip(lists, caps):
        while extra and lst and (cap is None or len(lst) < cap):
            lst.append(extra.pop(0))
    return extra


def _commit_without_flush() -> None:
    """Let the current transaction commit without waiting for its WAL flush (PostgreSQL; see ``apply_outcomes``)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _apply(cell: QueueCell, requests: list[OutcomeRequest], now: int) -> list[str | None]:
    """Apply each request's outcome on the locked cell; its label, or None when its claim was not current."""
    labels: list[str | None] = [None] * len(requests)
    acks = [i for i, r in enumerate(requests) if r.kind in ("ack", "drop")]
    if acks:
        where = " OR ".join(['("id" = %s AND "claim_token" = %s)'] * len(acks))
        params: list[Any] = []
        for i in acks:
            params += [requests[i].claim.message_pk, requests[i].claim.token]
        deleted = {pk for (pk,) in _rows(f'DELETE FROM "{_M}" WHERE {where} RETURNING "id"', params)}
        for i in acks:
            r = requests[i]
            if r.claim.message_pk in deleted or _ack_late(cell, r.claim):
                labels[i] = "acked" if r.kind == "ack" else "dropped"
    for i, r in enumerate(requests):
        if r.kind == "redeliver":
            seconds = r.timeout_seconds if r.timeout_seconds is not None else 0
            due_at = clamp_ms(now + seconds * 1000)
            if _rowcount(_REDELIVER, [due_at, r.status or 503, now, r.claim.message_pk, r.claim.token]):
                labels[i] = "redelivery scheduled"
        elif r.kind == "retry":
            labels[i] = _retry(cell, r, now)
    return labels


def _ack_late(cell: QueueCell, claim: Claim) -> bool:
    """Ack / drop of a claim that is no longer current: delete the message all the same, if it still exists.

    The application accepted (or permanently refused) the message, so — as
    upstream, whose ack deletes ``msg:<id>`` whatever its claim state — a 2xx
    (or 404/409/410/422) that arrives after the claim was recovered still
    deletes the message while it exists, whether it is due again or already
    re-claimed by another delivery. That other delivery then finds no row:
    its POST is skipped if not begun, and its outcome is ``"stale"`` and
    changes nothing. The message is deleted at most once, so never acked twice.
    """
    late = _rowcount(_ACK_LATE, [claim.message_pk, cell.pk, claim.message_id])
    if late:
        log.warning(
            "queue cell %s: %s answered after its claim was recovered; acked all the same",
            cell.name, claim.message_id,
        )
    return late > 0


def _retry(cell: QueueCell, r: OutcomeRequest, now: int) -> str | None:
    """A counted failure: ``attempt + 1``; a dead letter at ``QUEUE_MAX_ATTEMPTS``, else due after the backoff."""
    attempt = r.row.attempt + 1
    reason = r.reason or "unknown error"
    claim, row = r.claim, r.row
    if attempt < config.max_attempts():
        due_at = clamp_ms(now + backoff_seconds(attempt) * 1000)
        changed = _rowcount(_RETRY, [attempt, reason, r.status, due_at, now, claim.message_pk, claim.token])
        return "retry scheduled" if changed else None
    if not Message.objects.filter(pk=claim.message_pk, claim_token=claim.token).delete()[0]:
        return None
    key = dlq_key(now, row.message_id)
    DeadLetter.objects.filter(cell=cell, dlq_key=key).delete()  # the same key overwrites, as upstream
    DeadLetter.objects.create(
        cell=cell, dlq_key=key, message_id=row.message_id, queue_name=row.queue_name,
        pathname=row.pathname, body=codec.encode(row.body), target_base_url=row.target_base_url,
        idempotency_key=row.idempotency_key, attempt=attempt, enqueued_at=row.enqueued_at,
        last_error=reason, last_status=r.status, deliveries=row.deliveries, failed_at=now,
        run_id=run_of_message(row.queue_name, row.body),
    )
    return "dead-lettered"


_ONE_TRIP_OUTCOMES = (
    f'BEGIN; SET LOCAL synchronous_commit TO OFF; '
    f'SELECT "name" FROM "{_C}" WHERE "id" = %%s FOR UPDATE; '
    # claims whose deadline passed are lost (§7.4 step 1)
    f'UPDATE "{_M}" SET "due_at" = %%s, "inflight_deadline" = NULL, "claim_token" = NULL, '
    f'"delivery_started_at" = NULL, "updated_at" = %%s WHERE "cell_id" = %%s AND "inflight_deadline" <= %%s '
    f'RETURNING "id"; '
    # 503 redeliveries and counted retries of current claims (§7.6, §7.7); their ids are kept for the claim below
    f'%s; '
    # ack / drop the current claims, then claim for the freed slots, the first ones started (§7.7, §7.4 step 2)
    f'WITH "del" AS (DELETE FROM "{_M}" WHERE "cell_id" = %%s AND (%s) RETURNING "id"), '
    f'"app" AS (SELECT "id" FROM "del" UNION ALL SELECT "x"::bigint FROM '
    f"unnest(string_to_array(NULLIF(current_setting('worldcell.requeued', true), ''), ',')) AS \"x\"), "
    f'"pick" AS (SELECT "id", row_number() OVER (ORDER BY "due_at", "message_id") AS "rn" FROM "{_M}" '
    f'WHERE "cell_id" = %%s AND "due_at" IS NOT NULL AND "due_at" <= %%s ORDER BY "due_at", "message_id" '
    f'LIMIT GREATEST(0, LEAST((SELECT COALESCE(SUM("c"."cap"), 0) FROM (VALUES %s) AS "c"("id", "cap") '
    f'JOIN "app" ON "app"."id" = "c"."id"), '
    f'%%s - (({_INFLIGHT_COUNT.replace("%s", "%%s")}) - (SELECT COUNT(*) FROM "del"))))), '
    f'"upd" AS (UPDATE "{_M}" AS "m" SET "due_at" = NULL, "inflight_deadline" = %%s, "claim_token" = %%s, '
    f'"updated_at" = %%s, '
    f'"delivery_started_at" = CASE WHEN "pick"."rn" <= (SELECT COUNT(*) FROM "app") THEN %%s::bigint END, '
    f'"last_attempt_at" = CASE WHEN "pick"."rn" <= (SELECT COUNT(*) FROM "app") THEN %%s ELSE "m"."last_attempt_at" END, '
    f'"deliveries" = "m"."deliveries" + CASE WHEN "pick"."rn" <= (SELECT COUNT(*) FROM "app") THEN 1 ELSE 0 END '
    f'FROM "pick" WHERE "m"."id" = "pick"."id" '
    f'RETURNING "m"."id", "pick"."rn", "m"."delivery_started_at" IS NOT NULL, '
    f'{", ".join(chr(34) + "m" + chr(34) + "." + chr(34) + c + chr(34) for c in _DELIVERY_COLUMNS)}) '
    f'SELECT 0, "id", NULL::bigint, NULL::boolean, {", ".join(["NULL"] * len(_DELIVERY_COLUMNS))} FROM "app" '
    f'UNION ALL SELECT 1, * FROM "upd"; '
    # scheduleNextAlarm(now), §7.8
    f'WITH "nx" AS (SELECT CASE WHEN "n" IS NULL THEN NULL WHEN "n" <= %%s THEN %%s + {config.MIN_ALARM_DELAY_MS} '
    f'ELSE "n" END AS "n" FROM (SELECT LEAST(({_FIRST_DUE.replace("%s", "%%s")}), '
    f'({_FIRST_DEADLINE.replace("%s", "%%s")})) AS "n") AS "x"), '
    f'"u" AS (UPDATE "{_C}" SET "alarm_at" = "nx"."n" FROM "nx" WHERE "id" = %%s '
    f'AND "alarm_at" IS DISTINCT FROM "nx"."n") '
    f'SELECT "n" FROM "nx"; COMMIT'
)
_REQUEUE_NONE = "SELECT set_config('worldcell.requeued', '', true)"
_REQUEUE = (
    f'WITH "r" AS (UPDATE "{_M}" AS "m" SET "due_at" = "v"."due", '
    f'"attempt" = CASE WHEN "v"."counted" THEN "v"."attempt" ELSE "m"."attempt" END, '
    f'"last_error" = CASE WHEN "v"."counted" THEN "v"."err" ELSE "m"."last_error" END, '
    f'"last_status" = "v"."status", "inflight_deadline" = NULL, "claim_token" = NULL, '
    f'"delivery_started_at" = NULL, "updated_at" = %%s FROM (VALUES %s) AS '
    f'"v"("id", "token", "due", "attempt", "err", "status", "counted") '
    f'WHERE "m"."id" = "v"."id" AND "m"."claim_token" = "v"."token" RETURNING "m"."id") '
    f"SELECT set_config('worldcell.requeued', COALESCE(string_agg(\"id\"::text, ','), ''), true) FROM \"r\""
)
_REQUEUE_ROW = "(%s::bigint, %s::varchar, %s::bigint, %s::integer, %s::text, %s::integer, %s::boolean)"
_ONE_TRIP_LABELS = {"ack": "acked", "drop": "dropped", "redeliver": "redelivery scheduled", "retry": "retry scheduled"}


def _one_trip_outcome(r: OutcomeRequest) -> bool:
    """Whether ``_outcomes_in_one_trip`` takes this outcome (everything but dead letters, with ``claim_next``)."""
    if not r.claim_next:
        return False
    if r.kind == "retry":
        return r.row.attempt + 1 < config.max_attempts()
    return True


def _outcomes_in_one_trip(cell_id: int, requests: list[OutcomeRequest]) -> list[tuple[str, list[Claim]] | None]:
    """Outcomes of current claims plus the claim phase for their freed slots, in one round trip.

    Lock the cell; recover lost claims; requeue the 503 redeliveries (due at
    ``now + timeoutSeconds``, not counted) and the counted retries (attempt
    + 1, last error, due after the backoff); delete the acked and dropped
    messages; claim the earliest due messages — a redelivery due now among
    them — for the freed slots within the requests' caps, the first one per
    applied request started; compute ``scheduleNextAlarm(now)``; commit
    without waiting for the WAL flush (see ``apply_outcomes``). Returns per
    request ``(label, claims)``, or None for an outcome whose claim was not
    current (the general path then applies it as a late ack, or finds it
    stale). Wakes as the Python path does: a countdown for a near future
    alarm (``wake.after_fire``).
    """
    now = clock.now_ms()
    token = uuid.uuid4().hex
    deadline = clamp_ms(now + config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS)
    caps = [None if r.claim_next is True else int(r.claim_next) for r in requests]
    max_inflight = config.max_inflight()
    acks = [r for r in requests if r.kind in ("ack", "drop")]
    requeues = [r for r in requests if r.kind in ("redeliver", "retry")]
    params: list[Any] = [cell_id, now, now, cell_id, now]
    if requeues:
        requeue = _REQUEUE % ", ".join([_REQUEUE_ROW] * len(requeues))
        params.append(now)
        for r in requeues:
            if r.kind == "redeliver":
                seconds = r.timeout_seconds if r.timeout_seconds is not None else 0
                params += [r.claim.message_pk, r.claim.token, clamp_ms(now + seconds * 1000), r.row.attempt,
                           None, r.status or 503, False]
            else:
                attempt = r.row.attempt + 1
                params += [r.claim.message_pk, r.claim.token, clamp_ms(now + backoff_seconds(attempt) * 1000),
                           attempt, r.reason or "unknown error", r.status, True]
    else:
        requeue = _REQUEUE_NONE
    params.append(cell_id)
    for r in acks:
        params += [r.claim.message_pk, r.claim.token]
    match = " OR ".join(['("id" = %s AND "claim_token" = %s)'] * len(acks)) or "FALSE"
    params += [cell_id, now]
    for r, c in zip(requests, caps):
        params += [r.claim.message_pk, max_inflight if c is None else min(c, max_inflight)]
    params += [max_inflight, cell_id, deadline, token, now, now, now]
    params += [now, now, cell_id, cell_id, cell_id]
    cap_rows = ", ".join(["(%s::bigint, %s::bigint)"] * len(requests))
    locked, recovered, _, rows, [(alarm_at,)] = _run_script(
        _ONE_TRIP_OUTCOMES % (requeue, match, cap_rows), params
    )
    if not locked:
        return [None] * len(requests)
    name = locked[0][0]
    if recovered:
        log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", name, len(recovered))
    done = {row[1] for row in rows if row[0] == 0}
    claims: list[Claim] = []
    for _, pk, rn, started, *cols in sorted((r for r in rows if r[0] == 1), key=lambda r: r[2]):
        row = _delivery_row(tuple(cols))
        claims.append(Claim(name, cell_id, pk, row.message_id, token, started=row if started else None))
    results: list[tuple[str, list[Claim]] | None] = [None] * len(requests)
    applied: list[int] = []
    for i, r in enumerate(requests):
        if r.claim.message_pk in done:
            results[i] = (_ONE_TRIP_LABELS[r.kind], [])
            applied.append(i)
    leftover = _hand_out_claims(claims, [results[i][1] for i in applied], [caps[i] for i in applied])
    if leftover:  # cannot happen: claims are capped by the applied requests' caps
        log.warning("queue cell %s: %d claim(s) nobody took; left to their deadline", name, len(leftover))
    wake.after_fire(name, alarm_at, now)
    return results


_outcome_combiner: Combiner[OutcomeRequest, tuple[str, list[Claim]]] = Combiner(
    lambda cell_id, requests: apply_outcomes(cell_id, requests)  # type: ignore[arg-type]
)


def ack_message(claim: Claim, now: int | None = None) -> bool:
    """Ack (2xx): delete the message; False (nothing changed) when it is already gone (§7.7)."""
    return apply_outcome(claim, _NO_ROW, "ack", now=now) == "acked"


def drop_message(claim: Claim, now: int | None = None) -> bool:
    """Permanent failure (404/409/410/422): the same transition as an ack, no dead letter (§7.6)."""
    return apply_outcome(claim, _NO_ROW, "drop", now=now) == "dropped"


def redeliver_later(claim: Claim, timeout_seconds: float, now: int | None = None, status: int = 503) -> bool:
    """503 ``{"timeoutSeconds": n}``: due at ``now + n × 1000`` ms, not counted (§7.6); n may be 0 or negative."""
    result = apply_outcome(claim, _NO_ROW, "redeliver", status=status, timeout_seconds=timeout_seconds, now=now)
    return result == "redelivery scheduled"


def retry_message(
    claim: Claim, row: DeliveryRow, reason: str, now: int | None = None, status: int | None = None
) -> str:
    """A counted failure (§7.7): retry after ``min(60, 2^attempt)`` s, or dead-letter.

    ``attempt = row.attempt + 1`` (the row as claimed). When it reaches
    ``QUEUE_MAX_ATTEMPTS`` the message moves to ``DeadLetter`` under
    ``dlq:<ms13 now>:<id>`` (key released); otherwise it records ``attempt``,
    ``last_error = reason`` and is due after the backoff.
    Returns ``"dead-lettered"``, ``"retry scheduled"`` or ``"stale"``.
    """
    return apply_outcome(claim, row, "retry", status=status, reason=reason, now=now)  # type: ignore[return-value]


# --------------------------------------------------------------------------- admin methods (§7.9)


def cell_stats(cell_name: str) -> dict[str, Any]:
    """``{"pending","inflight","deadLetters","alarmAt"}`` of a cell in one read (PROTOCOL.md §7.9).

    ``pending`` counts scheduled messages, ``inflight`` claimed ones. A cell
    that was never written answers zeros and ``alarmAt: None``. Never locks.
    """
    rows = _rows(_STATS, [cell_name])
    alarm_at, pending, inflight, dead = rows[0] if rows else (None, 0, 0, 0)
    return {"pending": pending, "inflight": inflight, "deadLetters": dead, "alarmAt": alarm_at}


def _dead_letter_wire(d: DeadLetter) -> dict[str, Any]:
    row: dict[str, Any] = {
        "messageId": d.message_id,
        "queueName": d.queue_name,
        "pathname": d.pathname,
        "body": d.body_text,
        "targetBaseUrl": d.target_base_url,
    }
    if d.idempotency_key is not None:
        row["idempotencyKey"] = d.idempotency_key
    row["attempt"] = d.attempt
    row["enqueuedAt"] = d.enqueued_at
    if d.last_error is not None:
        row["lastError"] = d.last_error
    row["failedAt"] = d.failed_at
    return row


def list_dead_letters(cell_name: str, limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
    """A P4 page of dead letters (PROTOCOL.md §4.0, §7.9), ordered by ``dlq:`` key.

    ``cursor`` is a full key; rows with a key strictly greater are listed.
    Returns ``{"data":[rows],"cursor":<last key|None>,"hasMore":bool}``; with
    ``limit == 0`` and rows present: ``{"data":[],"hasMore":True}`` (no cursor
    member, as upstream).
    """
    qs = DeadLetter.objects.filter(cell__name=cell_name)
    if cursor is not None:
        qs = qs.filter(dlq_key__gt=cursor)
    fetched = list(qs.order_by("dlq_key")[: limit + 1])
    page = fetched[:limit]
    has_more = len(fetched) > limit
    result: dict[str, Any] = {"data": [_dead_letter_wire(d) for d in page]}
    if not has_more:
        result["cursor"] = None
    elif page:
        result["cursor"] = page[-1].dlq_key
    result["hasMore"] = has_more
    return result


def redrive_dead_letter(cell_name: str, message_id: str, now: int | None = None) -> dict[str, bool]:
    """Move the first dead letter (in key order) of ``message_id`` back to the queue (§7.9).

    The message starts over: attempt 0, no last error, ``enqueuedAt`` and
    ``targetBaseUrl`` kept, due now, ``armAlarmAtMost(now)``. Refuses with
    ``{"ok": False}`` (changing nothing) when another live message holds its
    idempotency key, or when there is no such dead letter.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"ok": False}
        now = clock.now_ms() if now is None else now
        _wake_after_commit(cell, now)
        dead = DeadLetter.objects.filter(cell=cell, message_id=message_id).order_by("dlq_key").first()
        if dead is None:
            return {"ok": False}
        key = dead.idempotency_key or None
        holder, same = _holder_and_same(cell, message_id, key)
        if holder is not None and holder[1] != message_id:
            return {"ok": False}
        fields = dict(
            queue_name=dead.queue_name,
            pathname=dead.pathname,
            body=dead.body,
            target_base_url=dead.target_base_url,
            idempotency_key=dead.idempotency_key,
            enqueued_at=dead.enqueued_at,
            due_at=now,
            run_id=dead.run_id,
            **_fresh_lifecycle(now),
        )
        if same is not None:
            Message.objects.filter(pk=same[0]).update(**fields)
        else:
            Message.objects.create(cell=cell, message_id=message_id, **fields)
        DeadLetter.objects.filter(pk=dead.pk).delete()
        arm_alarm_at_most(cell, now, now)
    return {"ok": True}


def purge_dead_letters(cell_name: str) -> dict[str, int]:
    """Delete every dead letter of the cell in one transaction; ``{"purged": n}`` (§7.9)."""
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"purged": 0}
        _wake_after_commit(cell, clock.now_ms())
        purged, _ = DeadLetter.objects.filter(cell=cell).delete()
    return {"purged": purged}


def rearm_alarm(cell_name: str, now: int | None = None) -> dict[str, int | None]:
    """``scheduleNextAlarm(now)`` and report the alarm: ``{"alarmAt": ms|None}`` (§7.9).

    The operator's recovery hatch; the cell's driver is woken on commit when
    the alarm is due. A cell that was never written answers ``None``.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"alarmAt": None}
        now = clock.now_ms() if now is None else now
        _wake_after_commit(cell, now)
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
        recovered = Message.objects.filter(cell=cell, inflight_deadline__lte=now).update(
            due_at=now, inflight_deadline=None, claim_token=None, delivery_started_at=None, updated_at=now
        )
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
