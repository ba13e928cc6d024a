"""The SQL text of the queue state machine, composed from named fragments defined once.

The statements of the delivery path (enqueue, claim, start, outcome, alarm,
stats) are fixed SQL text rather than ORM querysets: compiling a queryset
costs far more CPU than running the statement (about 0.6 ms against 0.15 ms
for a one-row lookup; 4-5 ms for the annotated stats query), and every cell
transition runs several of them while it holds the cell's lock. The text is
the same on PostgreSQL and SQLite (double-quoted identifiers, ``%s``
placeholders, ``RETURNING``, ``ON CONFLICT DO NOTHING``); only the row lock
clause differs, and the one-trip scripts (``one_trip_*``) are PostgreSQL's.

Composition rules (docs/decisions.md "Queue rules written once"): table
names come from the models through ``worldcell.sql.table``; values are
always ``%s`` parameters (never formatted into the text); a rule that a
statement applies is ONE fragment here, used by every statement that
applies it:

* ``RECOVER`` — lost claims become due (§7.4 step 1): the claim phase, the
  one-trip outcome script and ``rearm_cell``;
* ``claim_set(started)`` — what a claim writes (§7.4 step 2), with the POST
  marked begun where ``started`` holds: both claim statements of the Python
  path and the one-trip outcome script;
* ``soon(x)`` / ``armed(current, target)`` — ``scheduleNextAlarm``'s
  "overdue means now + 1" and ``armAlarmAtMost`` (§7.8) for the one-trip
  scripts; the Python path computes the same rules in ``machine.lock``
  (``soon``, ``armed``), and ``tests/queueing/test_queue_rules.py`` checks
  both against each other on generated inputs and cell states.
"""
from __future__ import annotations

from functools import lru_cache

from worldcell.sql import table

from cells.models.tombstone import FlowMessageRecord, RunTombstone

from ..models import DeadLetter, Message, QueueCell

M = table(Message)
C = table(QueueCell)
D = table(DeadLetter)
T = table(RunTombstone)
F = table(FlowMessageRecord)


def placeholders(n: int, item: str = "%s") -> str:
    """``item, item, …`` (``n`` times): a list of placeholders or placeholder rows."""
    return ", ".join([item] * n)


# --------------------------------------------------------------------------- the cell row

CELL_COLUMNS = '"id", "name", "queue_shards", "pinned_at", "alarm_at"'
CELL_BY_NAME = f'SELECT {CELL_COLUMNS} FROM "{C}" WHERE "name" = %s'
CELL_BY_ID = f'SELECT {CELL_COLUMNS} FROM "{C}" WHERE "id" = %s'
SET_ALARM = f'UPDATE "{C}" SET "alarm_at" = %s WHERE "id" = %s'
CELL_ALARMS = f'SELECT "name", "alarm_at" FROM "{C}" WHERE "alarm_at" <= %s ORDER BY "alarm_at", "name" LIMIT %s'
LOCK = " FOR UPDATE"
LOCK_OR_SKIP = " FOR UPDATE SKIP LOCKED"


# --------------------------------------------------------------------------- what a cell holds


def first_due(cell: str) -> str:
    """Subquery: the earliest ``due_at`` of cell ``cell`` (an id expression or ``%s``)."""
    return f'SELECT "due_at" FROM "{M}" WHERE "cell_id" = {cell} AND "due_at" IS NOT NULL ORDER BY "due_at" LIMIT 1'


def first_deadline(cell: str) -> str:
    """Subquery: the earliest in-flight deadline of cell ``cell``."""
    return (
        f'SELECT "inflight_deadline" FROM "{M}" WHERE "cell_id" = {cell} AND "inflight_deadline" IS NOT NULL '
        'ORDER BY "inflight_deadline" LIMIT 1'
    )


def inflight_count(cell: str) -> str:
    """Subquery: the number of claims in flight in cell ``cell``."""
    return f'SELECT COUNT(*) FROM "{M}" WHERE "cell_id" = {cell} AND "inflight_deadline" IS NOT NULL'


_CID = 'c."id"'
NEXT_ALARM_INPUTS = f"SELECT ({first_due('%s')}), ({first_deadline('%s')})"
CLAIM_STATE = (
    f'SELECT 0, COUNT(*), MIN("inflight_deadline"), NULL FROM "{M}" '
    'WHERE "cell_id" = %s AND "inflight_deadline" IS NOT NULL '
    f'UNION ALL SELECT * FROM (SELECT 1, "id", "due_at", "message_id" FROM "{M}" '
    'WHERE "cell_id" = %s AND "due_at" IS NOT NULL ORDER BY "due_at", "message_id" LIMIT %s) AS "due"'
)
CELL_STATE = (
    f'SELECT c."alarm_at", ({first_due(_CID)}), ({first_deadline(_CID)}), ({inflight_count(_CID)}) '
    f'FROM "{C}" c WHERE c."name" = %s'
)
STATS = (
    'SELECT c."alarm_at", '
    f'(SELECT COUNT(*) FROM "{M}" WHERE "cell_id" = c."id" AND "due_at" IS NOT NULL), '
    f'({inflight_count(_CID)}), '
    f'(SELECT COUNT(*) FROM "{D}" WHERE "cell_id" = c."id") '
    f'FROM "{C}" c WHERE c."name" = %s'
)


# --------------------------------------------------------------------------- the rules (one fragment each)

#: Lost claims — deadline ``≤ now`` — become due at ``now`` (§7.4 step 1).
#: Parameters: ``now`` (due), ``now`` (updated), cell id, ``now`` (deadline bound).
RECOVER = (
    f'UPDATE "{M}" SET "due_at" = %s, "inflight_deadline" = NULL, "claim_token" = NULL, '
    '"delivery_started_at" = NULL, "updated_at" = %s WHERE "cell_id" = %s AND "inflight_deadline" <= %s'
)


def claim_set(started: str) -> str:
    """The ``SET`` list of a claim (§7.4 step 2); the POST is marked begun where ``started`` holds.

    A claimed message is no longer due, gets the claim's deadline and token;
    a started one also records the POST (``delivery_started_at``,
    ``last_attempt_at``, ``deliveries + 1``) as ``start_delivery`` would.
    Parameters: deadline, token, ``now`` (updated), ``now`` (started), ``now``
    (last attempt). ``started`` is SQL without parameters (``TRUE``,
    ``FALSE``, a rank test).
    """
    return (
        '"due_at" = NULL, "inflight_deadline" = %s, "claim_token" = %s, "updated_at" = %s, '
        f'"delivery_started_at" = CASE WHEN {started} THEN CAST(%s AS BIGINT) END, '
        f'"last_attempt_at" = CASE WHEN {started} THEN CAST(%s AS BIGINT) ELSE "last_attempt_at" END, '
        f'"deliveries" = "deliveries" + CASE WHEN {started} THEN 1 ELSE 0 END'
    )


def soon(x: str) -> str:
    """``x``, or ``now + 1`` when ``x ≤ now`` (an overdue time re-arms just ahead, §7.8); NULL stays NULL.

    Parameters: ``now``, ``now + MIN_ALARM_DELAY_MS``.
    """
    return f"CASE WHEN {x} IS NULL THEN NULL WHEN {x} <= %s THEN %s ELSE {x} END"


def armed(current: str, target: str) -> str:
    """``armAlarmAtMost`` (§7.8): the alarm after arming ``current`` no later than ``target`` (a ``soon``).

    An overdue ``current`` moves to ``now + 1``, else the earlier of the two.
    Parameters: ``now``, ``now + MIN_ALARM_DELAY_MS``.
    """
    return (
        f"CASE WHEN {current} IS NOT NULL AND {current} <= %s THEN %s "
        f"ELSE LEAST(COALESCE({current}, {target}), {target}) END"
    )


# --------------------------------------------------------------------------- messages

MESSAGE_COLUMNS = (
    '"cell_id", "message_id", "queue_name", "pathname", "body", "target_base_url", '
    '"idempotency_key", "attempt", "enqueued_at", "due_at", "inflight_deadline", "claim_token", '
    '"delivery_started_at", "deliveries", "last_error", "last_status", "last_attempt_at", "updated_at", "run_id"'
)
#: One new message: cell id, message id, queue name, pathname, body, target, key, now, due, now, run id.
NEW_MESSAGE = "(%s, %s, %s, %s, %s, %s, %s, 0, %s, %s, NULL, NULL, NULL, 0, NULL, NULL, NULL, %s, %s)"
#: The same with the types spelled out (a ``VALUES`` list that is not an ``INSERT``'s own).
NEW_MESSAGE_TYPED = (
    "(CAST(%s AS BIGINT), CAST(%s AS TEXT), CAST(%s AS TEXT), CAST(%s AS TEXT), CAST(%s AS TEXT), "
    "CAST(%s AS TEXT), CAST(%s AS TEXT), 0, CAST(%s AS BIGINT), CAST(%s AS BIGINT), CAST(NULL AS BIGINT), "
    "CAST(NULL AS VARCHAR), CAST(NULL AS BIGINT), 0, CAST(NULL AS TEXT), CAST(NULL AS INTEGER), "
    "CAST(NULL AS BIGINT), CAST(%s AS BIGINT), CAST(%s AS TEXT))"
)

DELIVERY_COLUMNS = (
    "message_id", "queue_name", "pathname", "body", "target_base_url", "idempotency_key",
    "attempt", "enqueued_at", "deliveries",
)


def delivery_columns(alias: str | None = None) -> str:
    """The columns of a ``DeliveryRow``, in order, optionally qualified by ``alias``."""
    prefix = f'"{alias}".' if alias else ""
    return ", ".join(f'{prefix}"{c}"' for c in DELIVERY_COLUMNS)


@lru_cache(maxsize=None)
def insert_messages(n: int) -> str:
    """Insert ``n`` ``NEW_MESSAGE`` rows, skipping conflicts; returns each inserted id and the claims in flight.

    Parameters: the rows', then the cell id (for the count).
    """
    return (
        f'INSERT INTO "{M}" ({MESSAGE_COLUMNS}) VALUES {placeholders(n, NEW_MESSAGE)} '
        f'ON CONFLICT DO NOTHING RETURNING "message_id", ({inflight_count("%s")})'
    )


@lru_cache(maxsize=None)
def claim_started(n: int) -> str:
    """Claim ``n`` messages by id, their POST begun; returns id + delivery columns. Parameters: ``claim_set``'s, ids."""
    return (
        f'UPDATE "{M}" SET {claim_set("TRUE")} WHERE "id" IN ({placeholders(n)}) '
        f'RETURNING "id", {delivery_columns()}'
    )


@lru_cache(maxsize=None)
def claim_unstarted(n: int) -> str:
    """Claim ``n`` messages by id, POST not begun. Parameters: ``claim_set``'s, ids."""
    return f'UPDATE "{M}" SET {claim_set("FALSE")} WHERE "id" IN ({placeholders(n)})'


#: ``start_delivery``'s compare-and-set. Parameters: now ×3, new deadline, id, token, now.
START = (
    f'UPDATE "{M}" SET "delivery_started_at" = %s, "last_attempt_at" = %s, "deliveries" = "deliveries" + 1, '
    '"updated_at" = %s, "inflight_deadline" = %s WHERE "id" = %s AND "claim_token" = %s '
    f'AND "delivery_started_at" IS NULL AND "inflight_deadline" > %s RETURNING {delivery_columns()}'
)
#: A current claim's ``("id" = %s AND "claim_token" = %s)`` test.
CURRENT_CLAIM = '("id" = %s AND "claim_token" = %s)'


@lru_cache(maxsize=None)
def delete_current(n: int) -> str:
    """Delete the messages of ``n`` current claims (ack, drop); returns their ids. Parameters: id, token each."""
    return f'DELETE FROM "{M}" WHERE {" OR ".join([CURRENT_CLAIM] * n)} RETURNING "id"'


ACK_LATE = f'DELETE FROM "{M}" WHERE "id" = %s AND "cell_id" = %s AND "message_id" = %s'
#: Parameters: due, status, now, id, token.
REDELIVER = (
    f'UPDATE "{M}" SET "due_at" = %s, "inflight_deadline" = NULL, "claim_token" = NULL, '
    '"delivery_started_at" = NULL, "last_status" = %s, "updated_at" = %s WHERE "id" = %s AND "claim_token" = %s'
)
#: Parameters: attempt, error, status, due, now, id, token.
RETRY = (
    f'UPDATE "{M}" SET "attempt" = %s, "last_error" = %s, "last_status" = %s, "due_at" = %s, '
    '"inflight_deadline" = NULL, "claim_token" = NULL, "delivery_started_at" = NULL, "updated_at" = %s '
    'WHERE "id" = %s AND "claim_token" = %s'
)


# --------------------------------------------------------------------------- the run's fence and flow record


@lru_cache(maxsize=None)
def tombstoned(n: int) -> str:
    """Which of ``n`` run ids have a tombstone (the retention fence, docs/lifecycle.md §3): ``(run id, expired_at)``.

    The one test of "this run is expired" for enqueues, used by the general
    path as it stands and by ``one_trip_enqueue`` as its ``"dead"`` CTE.
    Parameters: the run ids.
    """
    return f'SELECT "run_id", "expired_at" FROM "{T}" WHERE "run_id" IN ({placeholders(n)})'


FLOW_RECORD_COLUMNS = '"run_id", "queue_cell", "queue_name", "pathname", "body", "target_base_url", "queue_shards", "recorded_at"'
#: A later workflow message of the run replaces its record (docs/lifecycle.md "Stuck-run repair").
FLOW_RECORD_CONFLICT = (
    'ON CONFLICT ("run_id") DO UPDATE SET "queue_cell" = excluded."queue_cell", "queue_name" = excluded."queue_name", '
    '"pathname" = excluded."pathname", "body" = excluded."body", "target_base_url" = excluded."target_base_url", '
    '"queue_shards" = excluded."queue_shards", "recorded_at" = excluded."recorded_at"'
)
#: Parameters: run id, cell name, queue name, pathname, body, target, shards, now.
UPSERT_FLOW_RECORD = (
    f'INSERT INTO "{F}" ({FLOW_RECORD_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) {FLOW_RECORD_CONFLICT}'
)


# --------------------------------------------------------------------------- one-trip scripts (PostgreSQL)

#: Commit without waiting for the WAL flush (see ``outcomes.apply_outcomes``).
NO_FLUSH = "SET LOCAL synchronous_commit TO OFF"
#: A transaction of its own that writes WAL and so waits for the flush of everything before it.
FLUSH = "SELECT pg_logical_emit_message(true, 'worldcell', 'enqueue')"


def script(*statements: str) -> str:
    """One ``BEGIN; …; COMMIT`` string of ``statements`` (sent in one round trip)."""
    return "; ".join(statements)


_RECORD_ROW = "(CAST(%s AS INTEGER), CAST(%s AS TEXT))"


@lru_cache(maxsize=None)
def one_trip_enqueue(n: int, n_fenced: int = 0, n_records: int = 0) -> str:
    """Lock, insert ``n`` rows unless the cell changed or their run is expired, ``armAlarmAtMost`` their
    earliest due, record the stored workflow messages, commit, flush.

    Parameters: cell id (lock); the ``NEW_MESSAGE_TYPED`` rows; the
    ``n_fenced`` run ids to check against the fence (``tombstoned``; a row
    whose run id is among the tombstoned ones is not inserted); cell id,
    name, shards (the cell is still the one known pinned); ``armed``'s and
    ``soon``'s (``now``, ``now + 1`` each); cell id (arm); with
    ``n_records``: cell name, shards, ``now``, then ``(order, message id)``
    per candidate record (the last stored one of each run is kept);
    cell id (count).
    Rows: the locked cell ``(name, shards, alarm)``; ``(inserted ids, alarm
    set or NULL, claims in flight, tombstoned run ids, their expired_at)``.
    """
    dead = tombstoned(n_fenced) if n_fenced else f'SELECT "run_id", "expired_at" FROM "{T}" WHERE FALSE'
    record = ""
    if n_records:
        record = (
            f', "rec" AS (INSERT INTO "{F}" ({FLOW_RECORD_COLUMNS}) '
            'SELECT DISTINCT ON ("v"."run_id") "v"."run_id", CAST(%s AS TEXT), "v"."queue_name", "v"."pathname", '
            '"v"."body", "v"."target_base_url", CAST(%s AS INTEGER), CAST(%s AS BIGINT) '
            f'FROM (VALUES {placeholders(n_records, _RECORD_ROW)}) AS "r"("ord", "mid") '
            'JOIN "ins" ON "ins"."message_id" = "r"."mid" JOIN "v" ON "v"."message_id" = "r"."mid" '
            f'ORDER BY "v"."run_id", "r"."ord" DESC {FLOW_RECORD_CONFLICT}) '
        )
    insert = (
        f'WITH "v" ({MESSAGE_COLUMNS}) AS (VALUES {placeholders(n, NEW_MESSAGE_TYPED)}), '
        f'"dead" AS ({dead}), '
        f'"ins" AS (INSERT INTO "{M}" ({MESSAGE_COLUMNS}) SELECT * FROM "v" '
        f'WHERE EXISTS (SELECT 1 FROM "{C}" WHERE "id" = %s AND "name" = %s AND "queue_shards" = %s) '
        'AND NOT EXISTS (SELECT 1 FROM "dead" WHERE "dead"."run_id" = "v"."run_id") '
        'ON CONFLICT DO NOTHING RETURNING "message_id", "due_at"), '
        f'"arm" AS (UPDATE "{C}" SET "alarm_at" = {armed(_ALARM, _TARGET)} '
        f'FROM (SELECT {soon(_EARLIEST_INSERTED)} AS "t" FROM "ins") AS "t" '
        'WHERE "id" = %s AND "t"."t" IS NOT NULL RETURNING "alarm_at")'
        f'{record} '
        "SELECT COALESCE((SELECT array_agg(\"message_id\") FROM \"ins\"), '{}'), "
        f'(SELECT "alarm_at" FROM "arm"), ({inflight_count("%s")}), '
        "COALESCE((SELECT array_agg(\"run_id\") FROM \"dead\"), '{}'), "
        "COALESCE((SELECT array_agg(\"expired_at\") FROM \"dead\"), '{}')"
    )
    return script("BEGIN", NO_FLUSH, f'SELECT "name", "queue_shards", "alarm_at" FROM "{C}" WHERE "id" = %s FOR UPDATE',
                  insert, "COMMIT", FLUSH)


_ALARM = '"alarm_at"'
_TARGET = '"t"."t"'
_EARLIEST_INSERTED = 'MIN("due_at")'

#: The first ``COUNT(app)`` picked messages are started: one per applied outcome's delivery thread.
_STARTED_BY_RANK = '"pick"."rn" <= (SELECT COUNT(*) FROM "app")'
#: The requeued ids, as the requeue statement left them in a transaction-local setting.
_REQUEUED = "unnest(string_to_array(NULLIF(current_setting('worldcell.requeued', true), ''), ','))"
#: An outcome entry ``"v"`` (``queueing.attempt_log``) the one-trip script applies, tested between the
#: requeue and the claim statement: requeued, or an ack/drop whose claim is still current.
APPLIED_BEFORE_CLAIM = (
    f'("v"."pk" IN (SELECT CAST("x" AS BIGINT) FROM {_REQUEUED} AS "x") '
    f'OR EXISTS (SELECT 1 FROM "{M}" WHERE "id" = "v"."pk" AND "claim_token" = "v"."token"))'
)
REQUEUE_NONE = "SELECT set_config('worldcell.requeued', '', true)"
#: One requeue: id, token, due, attempt, error, status, counted.
REQUEUE_ROW = (
    "(CAST(%s AS BIGINT), CAST(%s AS VARCHAR), CAST(%s AS BIGINT), CAST(%s AS INTEGER), CAST(%s AS TEXT), "
    "CAST(%s AS INTEGER), CAST(%s AS BOOLEAN))"
)
_CAP_ROW = "(CAST(%s AS BIGINT), CAST(%s AS BIGINT))"


@lru_cache(maxsize=None)
def requeue(n: int) -> str:
    """503 redeliveries and counted retries of ``n`` current claims; remembers the requeued ids for the claim.

    Parameters: ``now``, then ``REQUEUE_ROW`` each.
    """
    return (
        f'WITH "r" AS (UPDATE "{M}" AS "m" SET "due_at" = "v"."due", '
        '"attempt" = CASE WHEN "v"."counted" THEN "v"."attempt" ELSE "m"."attempt" END, '
        '"last_error" = CASE WHEN "v"."counted" THEN "v"."err" ELSE "m"."last_error" END, '
        '"last_status" = "v"."status", "inflight_deadline" = NULL, "claim_token" = NULL, '
        f'"delivery_started_at" = NULL, "updated_at" = %s FROM (VALUES {placeholders(n, REQUEUE_ROW)}) AS '
        '"v"("id", "token", "due", "attempt", "err", "status", "counted") '
        'WHERE "m"."id" = "v"."id" AND "m"."claim_token" = "v"."token" RETURNING "m"."id") '
        "SELECT set_config('worldcell.requeued', COALESCE(string_agg(CAST(\"id\" AS TEXT), ','), ''), true) FROM \"r\""
    )


@lru_cache(maxsize=None)
def one_trip_outcomes(n_requeues: int, n_acks: int, n_requests: int, record: str = "") -> str:
    """Outcomes of current claims, the claim phase for their freed slots and ``scheduleNextAlarm``, one string.

    Parameters, statement by statement: cell id (lock); ``RECOVER``'s; the
    requeue's (``requeue``, or none); cell id, id + token per ack (delete);
    cell id, ``now`` (due bound), id + cap per request, max in flight, cell
    id (count); ``claim_set``'s; ``soon``'s, cell id ×3 (the alarm). Rows:
    the locked cell's name; recovered ids; the requeue's setting; the
    applied ids ``(0, id, …)`` and the claims ``(1, id, rank, started,
    delivery columns…)``; the new alarm. ``record`` (statements returning no
    rows, ``queueing.attempt_log.one_trip``, their parameters after the
    requeue's) runs between the requeue and the claim.
    """
    acked = " OR ".join([CURRENT_CLAIM] * n_acks) or "FALSE"
    nulls = ", ".join(["NULL"] * len(DELIVERY_COLUMNS))
    claim = (
        f'WITH "del" AS (DELETE FROM "{M}" WHERE "cell_id" = %s AND ({acked}) RETURNING "id"), '
        f'"app" AS (SELECT "id" FROM "del" UNION ALL SELECT CAST("x" AS BIGINT) FROM {_REQUEUED} AS "x"), '
        f'"pick" AS (SELECT "id", row_number() OVER (ORDER BY "due_at", "message_id") AS "rn" FROM "{M}" '
        'WHERE "cell_id" = %s AND "due_at" IS NOT NULL AND "due_at" <= %s ORDER BY "due_at", "message_id" '
        'LIMIT GREATEST(0, LEAST((SELECT COALESCE(SUM("c"."cap"), 0) '
        f'FROM (VALUES {placeholders(n_requests, _CAP_ROW)}) AS "c"("id", "cap") '
        'JOIN "app" ON "app"."id" = "c"."id"), '
        f'%s - (({inflight_count("%s")}) - (SELECT COUNT(*) FROM "del"))))), '
        f'"upd" AS (UPDATE "{M}" AS "m" SET {claim_set(_STARTED_BY_RANK)} '
        'FROM "pick" WHERE "m"."id" = "pick"."id" '
        f'RETURNING "m"."id", "pick"."rn", "m"."delivery_started_at" IS NOT NULL, {delivery_columns("m")}) '
        f'SELECT 0, "id", CAST(NULL AS BIGINT), CAST(NULL AS BOOLEAN), {nulls} FROM "app" '
        'UNION ALL SELECT 1, * FROM "upd"'
    )
    alarm = (
        f'WITH "nx" AS (SELECT {soon(_EARLIEST)} AS "n" '
        f"FROM (SELECT LEAST(({first_due('%s')}), ({first_deadline('%s')})) AS \"n\") AS \"x\"), "
        f'"u" AS (UPDATE "{C}" SET "alarm_at" = "nx"."n" FROM "nx" WHERE "id" = %s '
        'AND "alarm_at" IS DISTINCT FROM "nx"."n") '
        'SELECT "n" FROM "nx"'
    )
    return script(
        "BEGIN", NO_FLUSH, f'SELECT "name" FROM "{C}" WHERE "id" = %s FOR UPDATE', RECOVER + ' RETURNING "id"',
        requeue(n_requeues) if n_requeues else REQUEUE_NONE, *([record] if record else []), claim, alarm, "COMMIT",
    )


_EARLIEST = '"n"'
