"""The per-message attempt log and the per-minute outcome counters, written with each outcome (docs/queue-console.md).

Every applied delivery outcome records, in the outcome's own transaction
(no extra commit: a crash leaves attempt, counters and outcome together or
none of them):

* one ``OutcomeMinute`` counter increment per (cell, queue name, minute):
  delivered (acked), dropped, retried (counted retry or 503 redelivery),
  dead-lettered — the cell's lock is already held, so the upsert never waits;
* one ``DeliveryAttempt`` row when the message lives on (a retry, a
  redelivery) or becomes a dead letter: when the POST started, how long it
  took (ms), the HTTP status or the transport error, the first
  ``HEAD_BYTES`` bytes of the answer and what the outcome did; at most
  ``KEEP_PER_MESSAGE`` rows per message (older ones are deleted in the same
  transaction);
* an ack or drop deletes the message's attempts with it.

The rules are SQL text written once here (``_statements``) and run by both
outcome paths of the queue machine: the general path (``record``, after the
labels are known, only the applied outcomes) and PostgreSQL's one-trip
script (``one_trip``, whose "applied" test is the machine's
``sql.APPLIED_BEFORE_CLAIM`` fragment). Only outcomes that carry an
``AttemptRecord`` (real deliveries, ``queueing.delivery``) are recorded;
machine calls without one (tests, tools) record nothing.

Bounded by retention: ``prune`` (run by the lifecycle tick) drops counter
minutes older than ``KEEP_MINUTES`` and attempts whose message and dead
letter are both gone (purged, swept with their run, acked after a redrive).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

from worldcell import clock
from worldcell import sql as executor
from worldcell.sql import table

from .models import DeadLetter, DeliveryAttempt, Message, OutcomeMinute

__all__ = [
    "AttemptRecord", "COUNTER_OF_LABEL", "HEAD_BYTES", "KEEP_MINUTES", "KEEP_PER_MESSAGE",
    "answer_head_text", "attempts_of", "minute_series", "one_trip", "prune", "record",
]

#: Answer bytes kept per attempt.
HEAD_BYTES = 512
#: Characters of a transport error kept per attempt.
ERROR_CHARS = 1000
#: Attempts kept per message (the newest).
KEEP_PER_MESSAGE = 20
#: Counter minutes kept (the dashboard shows the last 60).
KEEP_MINUTES = 120
#: Orphaned attempts one ``prune`` deletes at most.
PRUNE_BATCH = 5000

#: The counter an applied outcome (the machine's label) increments.
COUNTER_OF_LABEL = {
    "acked": "delivered",
    "dropped": "dropped",
    "retry scheduled": "retried",
    "redelivery scheduled": "retried",
    "dead-lettered": "dead_lettered",
}
#: Outcomes after which the message lives on (or is a dead letter): their attempt is logged.
_LOGGED = frozenset({"retry scheduled", "redelivery scheduled", "dead-lettered"})
#: Outcomes that delete the message: its attempts go with it.
_CLEARED = frozenset({"acked", "dropped"})
COUNTERS = ("delivered", "dropped", "retried", "dead_lettered")

A = table(DeliveryAttempt)
O = table(OutcomeMinute)
M = table(Message)
D = table(DeadLetter)


@dataclass(frozen=True)
class AttemptRecord:
    """What one POST gave, for the log (built by ``queueing.delivery.deliver_claim``).

    ``started_at`` epoch ms; ``duration_ms`` ms; ``status`` None for a
    transport error, ``error`` its text (or the retry reason); ``answer_head``
    the first bytes of the answer (``HEAD_BYTES`` at most, None when none
    was read). ``may_have_log``: the message had earlier POSTs, so an ack
    must delete its logged attempts (a first POST has none to delete).
    """

    queue_name: str
    attempt: int
    started_at: int
    duration_ms: int
    status: int | None
    error: str | None
    answer_head: bytes | None
    may_have_log: bool = True


def answer_head_text(head: bytes | None) -> str | None:
    """The stored form of an answer's first bytes: UTF-8, undecodable bytes and NUL as ``\\xNN`` escapes."""
    if head is None:
        return None
    return head[:HEAD_BYTES].decode("utf-8", "backslashreplace").replace("\x00", "\\x00")


# --------------------------------------------------------------------------- the SQL, written once

#: What each statement reads per outcome (``"v"``): the claim (pk, token) for the "applied" test, then its own columns.
_COUNTED = ("(CAST(%s AS BIGINT), CAST(%s AS VARCHAR(32)), CAST(%s AS TEXT), CAST(%s AS TEXT))",
            '"pk", "token", "queue_name", "counter"')
_LOGGED_ROW = (
    "(CAST(%s AS BIGINT), CAST(%s AS VARCHAR(32)), CAST(%s AS TEXT), CAST(%s AS INTEGER), CAST(%s AS BIGINT), "
    "CAST(%s AS INTEGER), CAST(%s AS INTEGER), CAST(%s AS TEXT), CAST(%s AS TEXT), CAST(%s AS TEXT))",
    '"pk", "token", "message_id", "attempt", "started_at", "duration_ms", "status", "error", "answer_head", "result"',
)
_CLEARED_ROW = ("(CAST(%s AS BIGINT), CAST(%s AS VARCHAR(32)), CAST(%s AS TEXT))", '"pk", "token", "message_id"')


def _values(shape: tuple[str, str], n: int) -> str:
    return f'WITH "v"({shape[1]}) AS (VALUES {", ".join([shape[0]] * n)}) '


@lru_cache(maxsize=None)
def _statements(n: int, logged: int, cleared: int, applied: str) -> tuple[str, ...]:
    """The statements recording ``n`` outcomes, ``logged`` of them with an attempt row, ``cleared`` acks, in order.

    ``applied`` is SQL over the outcome ``"v"`` (its ``"pk"`` and
    ``"token"``) that holds for an outcome the transaction applied (``TRUE``
    when only applied ones are passed). Parameters of each: its rows, then
    the cell id (the counters: and the minute; the cap: the logged message
    ids and the cap instead of rows).
    """
    sums = ", ".join(f'SUM(CASE WHEN "v"."counter" = \'{c}\' THEN 1 ELSE 0 END)' for c in COUNTERS)
    adds = ", ".join(f'"{c}" = "{O}"."{c}" + EXCLUDED."{c}"' for c in COUNTERS)
    out = [
        f'{_values(_COUNTED, n)}INSERT INTO "{O}" ("cell_id", "queue_name", "minute", {", ".join(COUNTERS)}) '
        f'SELECT %s, "v"."queue_name", %s, {sums} FROM "v" WHERE {applied} GROUP BY "v"."queue_name" '
        f'ON CONFLICT ("cell_id", "queue_name", "minute") DO UPDATE SET {adds}'
    ]
    if logged:
        out.append(
            f'{_values(_LOGGED_ROW, logged)}INSERT INTO "{A}" ("cell_id", "message_id", "attempt", "started_at", '
            '"duration_ms", "status", "error", "answer_head", "result") '
            'SELECT %s, "message_id", "attempt", "started_at", "duration_ms", "status", "error", "answer_head", '
            f'"result" FROM "v" WHERE {applied}'
        )
        out.append(
            f'DELETE FROM "{A}" WHERE "cell_id" = %s AND "message_id" IN ({", ".join(["%s"] * logged)}) '
            f'AND "id" NOT IN (SELECT "k"."id" FROM "{A}" AS "k" WHERE "k"."cell_id" = "{A}"."cell_id" '
            f'AND "k"."message_id" = "{A}"."message_id" ORDER BY "k"."id" DESC LIMIT %s)'
        )
    if cleared:
        out.append(
            f'{_values(_CLEARED_ROW, cleared)}DELETE FROM "{A}" WHERE "cell_id" = %s AND "message_id" IN '
            f'(SELECT "message_id" FROM "v" WHERE {applied})'
        )
    return tuple(out)


def _plan(
    cell_id: int, items: Sequence[tuple[Any, Any, str]], now: int, applied: str
) -> list[tuple[str, list[Any]]]:
    """``(statement, params)`` pairs recording ``items`` = ``(claim, AttemptRecord, label)`` each."""
    counted: list[Any] = []
    logged: list[Any] = []
    logged_ids: list[str] = []
    cleared: list[Any] = []
    for claim, rec, label in items:
        counted += [claim.message_pk, claim.token, rec.queue_name, COUNTER_OF_LABEL[label]]
        if label in _LOGGED:
            logged_ids.append(claim.message_id)
            logged += [
                claim.message_pk, claim.token, claim.message_id, rec.attempt, rec.started_at, rec.duration_ms,
                rec.status, rec.error[:ERROR_CHARS] if rec.error else None, answer_head_text(rec.answer_head), label,
            ]
        elif label in _CLEARED and rec.may_have_log:
            cleared += [claim.message_pk, claim.token, claim.message_id]
    statements = _statements(len(items), len(logged_ids), len(cleared) // 3, applied)
    params = [counted + [cell_id, now // 60_000]]
    if logged_ids:
        params.append(logged + [cell_id])
        params.append([cell_id, *logged_ids, KEEP_PER_MESSAGE])
    if cleared:
        params.append(cleared + [cell_id])
    return list(zip(statements, params))


def record(cell_id: int, requests: Sequence[Any], labels: Sequence[str | None], now: int) -> None:
    """Record the applied outcomes among ``requests`` (``OutcomeRequest``, label or None), in the open transaction.

    Called by the general outcome path once the labels are known; requests
    without an ``attempt`` record, and stale ones (label None), record nothing.
    """
    items = [(r.claim, r.attempt, label) for r, label in zip(requests, labels) if label and r.attempt is not None]
    if not items:
        return
    db = executor.database()
    for statement, params in _plan(cell_id, items, now, "TRUE"):
        executor.rowcount(db, statement, params)


def one_trip(
    cell_id: int, requests: Sequence[Any], label_of: Callable[[Any], str], now: int, applied: str
) -> tuple[str, list[Any]]:
    """Statements and parameters to splice into a one-trip outcome script (``"; "``-joined; may be empty).

    ``label_of(request)`` is the label the script gives the request when it
    applies; ``applied`` the script's SQL test for that (over ``"v"``).
    """
    items = [(r.claim, r.attempt, label_of(r)) for r in requests if r.attempt is not None]
    if not items:
        return "", []
    plan = _plan(cell_id, items, now, applied)
    return "; ".join(s for s, _ in plan), [p for _, ps in plan for p in ps]


# --------------------------------------------------------------------------- reading


def attempts_of(cell_id: int, message_id: str) -> list[DeliveryAttempt]:
    """The logged attempts of one message, newest first (at most ``KEEP_PER_MESSAGE``; one query)."""
    return list(
        DeliveryAttempt.objects.filter(cell_id=cell_id, message_id=message_id).order_by("-id")[:KEEP_PER_MESSAGE]
    )


_SUMS = ", ".join('SUM("%s")' % c for c in COUNTERS)
_SERIES = (
    f'SELECT "queue_name", "minute", {_SUMS} '
    f'FROM "{O}" WHERE "minute" >= %s AND "minute" <= %s GROUP BY "queue_name", "minute"'
)


def minute_series(minutes: int = 60, now: int | None = None) -> dict[str, Any]:
    """Outcome counts per queue name and minute over the last ``minutes`` minutes, summed over shards (one query).

    Returns ``{"start": first minute (epoch ms // 60000), "minutes": n,
    "queues": {queue name: {counter: [n per minute, oldest first]}},
    "totals": {counter: total}}``.
    """
    now = clock.now_ms() if now is None else now
    last = now // 60_000
    start = last - minutes + 1
    rows = executor.rows(
        executor.database(),
        _SERIES,
        [start, last],
    )
    queues: dict[str, dict[str, list[int]]] = {}
    totals = dict.fromkeys(COUNTERS, 0)
    for queue_name, minute, *counts in rows:
        series = queues.setdefault(queue_name, {c: [0] * minutes for c in COUNTERS})
        for c, n in zip(COUNTERS, counts):
            series[c][int(minute) - start] += int(n)
            totals[c] += int(n)
    return {"start": start, "minutes": minutes, "queues": dict(sorted(queues.items())), "totals": totals}


# --------------------------------------------------------------------------- retention


def prune(now: int | None = None, batch: int = PRUNE_BATCH) -> dict[str, int]:
    """Delete counter minutes older than ``KEEP_MINUTES`` and up to ``batch`` orphaned attempts.

    An attempt is orphaned when neither its message nor a dead letter of it
    exists in its cell. Returns ``{"minutes": n, "attempts": n}`` deleted.
    Each delete is one statement (its own transaction in autocommit).
    """
    now = clock.now_ms() if now is None else now
    db = executor.database()
    minutes = executor.rowcount(db, f'DELETE FROM "{O}" WHERE "minute" < %s', [now // 60_000 - KEEP_MINUTES])
    attempts = executor.rowcount(
        db,
        f'DELETE FROM "{A}" WHERE "id" IN (SELECT "a"."id" FROM "{A}" AS "a" '
        f'WHERE NOT EXISTS (SELECT 1 FROM "{M}" AS "m" WHERE "m"."cell_id" = "a"."cell_id" '
        'AND "m"."message_id" = "a"."message_id") '
        f'AND NOT EXISTS (SELECT 1 FROM "{D}" AS "d" WHERE "d"."cell_id" = "a"."cell_id" '
        'AND "d"."message_id" = "a"."message_id") LIMIT %s)',
        [batch],
    )
    return {"minutes": minutes, "attempts": attempts}
