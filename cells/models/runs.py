"""Models of the runs cell: one run = one cell (PROTOCOL.md §5.9, DESIGN.md).

Upstream keeps a run cell as keys in one private map (``run``, ``step:<id>``,
``stepcreated:<ISO>:<id>``, ``hook:<id>``, ``hookevent:<id>``,
``event:<eventId>``, ``event_sequence``). Here each key family is a table an
operator can query:

==============================  ==========================================
upstream key                    row
==============================  ==========================================
``schema_version``,             ``RunCellState`` (the lock target; exists
``event_sequence``              before the run does)
``run``                         ``Run`` (primary key = the cell row)
``step:<id>`` +                 ``Step`` (``sort_key`` = ``<ISO>:<id>``)
``stepcreated:<ISO>:<id>``
``hook:<id>`` +                 ``Hook`` (live hooks only)
``hookcreated:<ISO>:<id>``
``hookevent:<id>``              ``HookMarker`` (outlives the hook)
``event:<eventId>``             ``Event`` (the whole encoded event in ``body``)
==============================  ==========================================

Payload columns (input, output, error, executionContext, metadata, the event
body) hold codec-encoded JSON text (``worldcell.codec``): full fidelity for
Dates, bytes and U+0000, which PostgreSQL ``jsonb`` would reject. SQL NULL in
a payload column means "absent". ``to_entity`` / ``entity_columns`` convert
between a row and the wire-shaped entity dict.

Range-scanned key columns (``Step.sort_key``, ``Hook.sort_key``,
``Event.event_id``) compare bytewise (``BytewiseTextField``), so a cursor
string sent by a client is compared exactly as upstream compares keys (§4.0).
"""
from __future__ import annotations

import hashlib
import re
import weakref
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable, Iterator

from django.db import DEFAULT_DB_ALIAS, connections, models

from worldcell import codec
from worldcell.fields import BytewiseTextField  # also the path the migrations name
from worldcell.keys import storable_text as _storable

from ..event_schemas import RUN_STATUSES, STEP_STATUSES

__all__ = [
    "BytewiseTextField",
    "is_missing_prepared_statement",
    "Event",
    "Hook",
    "HookMarker",
    "LockedRunCell",
    "Run",
    "RunCellState",
    "Step",
    "read_event",
    "read_page",
    "read_run",
    "read_step",
]


# How ``EntityRow.entity_from_row`` turns a column value into a member value.
_PLAIN, _PAYLOAD, _TIME, _NUMBER, _BOOL = range(5)
_MISSING: Any = object()


def json_number(value: float) -> int | float:
    """A stored float as the JSON number the client sent (3.0 -> 3)."""
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


class EntityRow:
    """A row that stores one wire entity, member by member.

    ``MEMBERS`` maps each wire member to its column, in the wire order;
    members in ``PAYLOADS`` are stored as codec-encoded text. A NULL column is
    an absent member, so ``to_entity`` never produces ``null`` (§3.5).
    ``CONSTANTS`` are members every entity of the kind carries unchanged.
    """

    MEMBERS: dict[str, str] = {}
    PAYLOADS: frozenset[str] = frozenset()
    CONSTANTS: dict[str, Any] = {}

    @classmethod
    def member_kinds(cls) -> tuple[tuple[str, int], ...]:
        """``(member, kind)`` in ``MEMBERS`` order: how ``entity_from_row`` reads each column."""
        kinds = cls.__dict__.get("_member_kinds")
        if kinds is None:
            out = []
            for member, column in cls.MEMBERS.items():
                field = cls._meta.get_field(column)
                if member in cls.PAYLOADS:
                    kind = _PAYLOAD
                elif isinstance(field, models.DateTimeField):
                    kind = _TIME
                elif isinstance(field, models.FloatField):
                    kind = _NUMBER
                elif isinstance(field, models.BooleanField):
                    kind = _BOOL
                else:
                    kind = _PLAIN
                out.append((member, kind))
            kinds = cls._member_kinds = tuple(out)
        return kinds

    @classmethod
    def entity_from_row(cls, run_id: str, values: Iterable[Any]) -> dict[str, Any]:
        """The entity out of raw column values in ``MEMBERS`` order (``select_columns``).

        Works on what either database returns: aware (PostgreSQL) or naive
        UTC (SQLite) datetimes, 0/1 or bools, floats for spec versions.
        """
        entity: dict[str, Any] = {"runId": run_id}
        for (member, kind), value in zip(cls.member_kinds(), values):
            if value is None:
                continue
            if kind == _PAYLOAD:
                value = codec.decode(value)
            elif kind == _TIME:
                value = codec.to_utc_ms(value)
            elif kind == _NUMBER:
                value = json_number(value)
            elif kind == _BOOL:
                value = bool(value)
            entity[member] = value
        if cls.CONSTANTS:
            entity.update(cls.CONSTANTS)
        return entity

    @classmethod
    def changed_members(cls, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        """Members of ``new`` that must be written over ``old``, in ``MEMBERS`` order.

        Payload members count as changed unless they are the very same object
        (so a big unchanged input is neither re-encoded nor rewritten, and never
        compared); other members unless equal with the same type.
        """
        changed = []
        for member in cls.MEMBERS:
            a, b = old.get(member, _MISSING), new.get(member, _MISSING)
            if a is b or (member not in cls.PAYLOADS and type(a) is type(b) and a == b):
                continue
            changed.append(member)
        return changed

    @classmethod
    def select_columns(cls, alias: str) -> str:
        """``alias."col", …`` for every member column, in ``MEMBERS`` order."""
        return ", ".join(f'{alias}."{column}"' for column in cls.MEMBERS.values())

    @classmethod
    def entity_columns(cls, entity: dict[str, Any], members: Iterable[str] | None = None) -> dict[str, Any]:
        """Column values of the members of a validated ``entity`` (all of them, or only ``members``).

        Members that have no column (``runId``, the constants) are skipped.
        """
        columns: dict[str, Any] = {}
        for member in cls.MEMBERS if members is None else [m for m in members if m in cls.MEMBERS]:
            value = entity.get(member)
            if value is not None and member in cls.PAYLOADS:
                value = codec.encode(value)
            columns[cls.MEMBERS[member]] = value
        return columns

    def to_entity(self, run_id: str) -> dict[str, Any]:
        """The entity as the wire carries it, stamped with ``run_id``."""
        return self.entity_from_row(run_id, [getattr(self, column) for column in self.MEMBERS.values()])


class RunCellState(models.Model):
    """One run cell: the row every ``applyEvent`` on the run locks first.

    It exists before the run entity does (created on the first call that
    writes), so two concurrent ``run_created`` for one run queue on its lock
    instead of racing on an insert.

    Fields:
        name: the cell name = the run id (``wrun_…``); unique.
        event_sequence: the last event sequence number handed out; event ids
            are ``wevt_z`` + this number zero-padded to 20 digits (§5.5).
        schema_version: the run-cell layout version (§10); every cell
            written by worldcell is at version 3.
    """

    name = models.TextField(help_text="cell name = run id")
    event_sequence = models.BigIntegerField(default=0, help_text="last event sequence number handed out")
    schema_version = models.PositiveSmallIntegerField(default=3)
    # Retention fence (docs/lifecycle.md "Tombstones"): set, under this row's lock,
    # in the transaction that writes the run's tombstone; never cleared. The row
    # itself is never deleted, so a late event finds it and answers RUN_EXPIRED.
    expired = models.BooleanField(default=False, db_default=False, help_text="the run expired (see its tombstone)")

    class Meta:
        verbose_name = "run cell"
        constraints = [models.UniqueConstraint(fields=["name"], name="cells_runcellstate_name_uniq")]

    def __str__(self) -> str:
        return self.name


class Run(EntityRow, models.Model):
    """The run entity of a run cell (PROTOCOL.md §5.2 WorkflowRun).

    Fields:
        cell: the owning cell (primary key); ``cell.name`` is the run id.
        status: pending | running | completed | failed | cancelled.
        deployment_id, workflow_name: as sent with ``run_created``.
        spec_version: the spec version of the request that created the run.
        execution_context, input, output, error: codec-encoded JSON, NULL = absent.
        started_at, completed_at, expired_at: NULL = absent (expired_at is never set).
        created_at, updated_at: UTC, millisecond precision.
    """

    MEMBERS = {
        "status": "status",
        "deploymentId": "deployment_id",
        "workflowName": "workflow_name",
        "specVersion": "spec_version",
        "executionContext": "execution_context",
        "input": "input",
        "output": "output",
        "error": "error",
        "expiredAt": "expired_at",
        "startedAt": "started_at",
        "completedAt": "completed_at",
        "createdAt": "created_at",
        "updatedAt": "updated_at",
    }
    PAYLOADS = frozenset({"executionContext", "input", "output", "error"})

    cell = models.OneToOneField(RunCellState, primary_key=True, on_delete=models.CASCADE, related_name="run")
    status = models.CharField(max_length=16, choices=[(s, s) for s in RUN_STATUSES])
    deployment_id = models.TextField()
    workflow_name = models.TextField()
    spec_version = models.FloatField(null=True, blank=True)
    execution_context = models.TextField(null=True, blank=True, help_text="codec-encoded JSON object")
    input = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    output = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    error = models.TextField(null=True, blank=True, help_text="codec-encoded StructuredError")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "run"
        # Operator actions beyond viewing (the admin's "Cancel run").
        permissions = [("cancel_run", "Can cancel runs (records a run_cancelled event)")]
        indexes = [
            models.Index(fields=["status"], name="cells_run_status_idx"),
            models.Index(fields=["workflow_name"], name="cells_run_workflow_idx"),
            models.Index(fields=["deployment_id"], name="cells_run_deployment_idx"),
            models.Index(fields=["created_at"], name="cells_run_created_idx"),
            models.Index(fields=["completed_at"], name="cells_run_completed_idx"),  # retention (cells.lifecycle)
        ]

    def __str__(self) -> str:
        return f"run {self.cell_id} ({self.status})"


def creation_sort_key(created_at: datetime, entity_id: str) -> str:
    """``<ISO createdAt>:<id>``: the ``stepcreated:``/``hookcreated:`` key suffix and P2 cursor (§4.0)."""
    return f"{codec.format_iso(created_at)}:{entity_id}"


class Step(EntityRow, models.Model):
    """A step of a run (PROTOCOL.md §5.2 Step).

    Fields:
        run: the owning run.
        step_id: the step id (the ``correlationId`` of its events); unique per run.
        step_name, status, attempt: as on the wire.
        input, output, error: codec-encoded JSON, NULL = absent.
        started_at, completed_at, retry_after: NULL = absent.
        created_at, updated_at: UTC, millisecond precision.
        spec_version: the spec version of the request that created the step.
        sort_key: ``<ISO createdAt>:<stepId>``, bytewise; ``listSteps`` pages by it.
    """

    MEMBERS = {
        "stepId": "step_id",
        "stepName": "step_name",
        "status": "status",
        "input": "input",
        "output": "output",
        "error": "error",
        "attempt": "attempt",
        "startedAt": "started_at",
        "completedAt": "completed_at",
        "createdAt": "created_at",
        "updatedAt": "updated_at",
        "retryAfter": "retry_after",
        "specVersion": "spec_version",
    }
    PAYLOADS = frozenset({"input", "output", "error"})

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.TextField()
    step_name = models.TextField()
    status = models.CharField(max_length=16, choices=[(s, s) for s in STEP_STATUSES])
    attempt = models.BigIntegerField(default=0)
    input = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    output = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    error = models.TextField(null=True, blank=True, help_text="codec-encoded StructuredError")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    retry_after = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    spec_version = models.FloatField(null=True, blank=True)
    sort_key = BytewiseTextField(help_text="<ISO createdAt>:<stepId>, the listSteps order and cursor")

    class Meta:
        verbose_name = "step"
        constraints = [models.UniqueConstraint(fields=["run", "step_id"], name="cells_step_run_step_uniq")]
        indexes = [models.Index(fields=["run", "sort_key"], name="cells_step_run_sort_idx")]

    def __str__(self) -> str:
        return f"step {self.step_id} ({self.status})"


class Hook(EntityRow, models.Model):
    """A live hook of a run (PROTOCOL.md §5.2 Hook); deleted on dispose or terminal run.

    Fields:
        run: the owning run.
        hook_id: the hook id (the ``correlationId`` of its events); unique per run.
        token: the hook token (globally owned through the index cell, §6.3).
        metadata: codec-encoded JSON, NULL = absent.
        is_webhook: as sent with ``hook_created`` (default false).
        created_at: UTC, millisecond precision.
        spec_version: the spec version of the request that created the hook.
        sort_key: ``<ISO createdAt>:<hookId>``, bytewise; ``listHooks`` pages by it.

    ``ownerId``, ``projectId`` and ``environment`` are always ``""`` (§5.2)
    and are not stored.
    """

    MEMBERS = {
        "hookId": "hook_id",
        "token": "token",
        "metadata": "metadata",
        "createdAt": "created_at",
        "specVersion": "spec_version",
        "isWebhook": "is_webhook",
    }
    PAYLOADS = frozenset({"metadata"})
    CONSTANTS = {"ownerId": "", "projectId": "", "environment": ""}

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="hooks", db_index=False)
    hook_id = models.TextField()
    token = models.TextField()
    metadata = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    is_webhook = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    spec_version = models.FloatField(null=True, blank=True)
    sort_key = BytewiseTextField(help_text="<ISO createdAt>:<hookId>, the listHooks order and cursor")

    class Meta:
        verbose_name = "hook"
        constraints = [models.UniqueConstraint(fields=["run", "hook_id"], name="cells_hook_run_hook_uniq")]
        indexes = [
            models.Index(fields=["run", "sort_key"], name="cells_hook_run_sort_idx"),
            models.Index(fields=["token"], name="cells_hook_token_idx"),
        ]

    def __str__(self) -> str:
        return f"hook {self.hook_id}"


class HookMarker(models.Model):
    """``hookevent:<hookId>``: a hook was created on this run (PROTOCOL.md §5.6, quirk Q5).

    Never deleted, so a hook id is never created twice on one run, even
    after the hook was disposed or released.

    Fields:
        run: the owning run.
        hook_id: the hook id; unique per run.
        event_id: the id of the ``hook_created`` event that created it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="hook_markers", db_index=False)
    hook_id = models.TextField()
    event_id = models.TextField()

    class Meta:
        verbose_name = "hook marker"
        constraints = [models.UniqueConstraint(fields=["run", "hook_id"], name="cells_hookmarker_run_hook_uniq")]

    def __str__(self) -> str:
        return f"hook {self.hook_id} created by {self.event_id}"


class Event(models.Model):
    """One event of a run's append-only log (PROTOCOL.md §5.2 Event).

    Fields:
        run: the owning run.
        event_id: ``wevt_z`` + the 20-digit sequence; unique per run, bytewise,
            so its order is the log order and ``listEvents`` cursors compare exactly.
        sequence: the event's sequence number (the digits of ``event_id``).
        event_type, correlation_id, created_at: copies of the event's members
            for operators (filtering, timelines).
        body: the whole event, codec-encoded, exactly as ``getEvent`` returns it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    event_id = BytewiseTextField()
    sequence = models.BigIntegerField()
    event_type = models.CharField(max_length=32)
    correlation_id = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField()
    body = models.TextField(help_text="codec-encoded event")

    class Meta:
        verbose_name = "event"
        constraints = [models.UniqueConstraint(fields=["run", "event_id"], name="cells_event_run_event_uniq")]
        indexes = [models.Index(fields=["correlation_id"], name="cells_event_correlation_idx")]

    def __str__(self) -> str:
        return f"{self.event_id} {self.event_type}"

    def to_entity(self) -> dict[str, Any]:
        """The stored event, decoded."""
        return codec.decode(self.body)


# =========================================================================== SQL of the run cell
#
# ``applyEvent`` and the reads run fixed SQL text on Django's connection
# instead of building querysets: compiling a queryset costs about 1 ms of CPU
# per statement, the statements themselves a fraction of that. Identifiers are
# double-quoted and placeholders are ``%s``, valid on PostgreSQL and SQLite.

_CELL = RunCellState._meta.db_table
_RUN = Run._meta.db_table
_STEP = Step._meta.db_table
_HOOK = Hook._meta.db_table
_MARKER = HookMarker._meta.db_table
_EVENT = Event._meta.db_table

#: The id of the cell named by the next parameter; none for an expired run (its
#: data may be half deleted: docs/lifecycle.md "Tombstones").
_CELL_ID = f'(SELECT "id" FROM "{_CELL}" WHERE "name" = %s AND NOT "expired")'
#: Create-if-missing without burning an identity value when the row exists.
_CREATE_CELL = (
    f'INSERT INTO "{_CELL}" ("name", "event_sequence", "schema_version") '
    f'SELECT CAST(%s AS text), 0, 3 WHERE NOT EXISTS (SELECT 1 FROM "{_CELL}" WHERE "name" = %s) '
    'ON CONFLICT ("name") DO NOTHING'
)
_LOCK_CELL = f'SELECT 1 FROM "{_CELL}" WHERE "name" = %s FOR UPDATE'
_SAVE_SEQUENCE = f'UPDATE "{_CELL}" SET "event_sequence" = %s WHERE "id" = %s'
_FIRST_EVENTS = f'SELECT "body" FROM "{_EVENT}" WHERE "run_id" = {_CELL_ID} ORDER BY "event_id" LIMIT %s'
#: The ``run_started`` preload: only a pending run starts and returns its events;
#: a replay on a running run (sent by every flow invocation) or a refusal on a
#: finished one reads nothing.
_FIRST_EVENTS_IF_PENDING = (
    f'SELECT e."body" FROM "{_EVENT}" e JOIN "{_RUN}" r ON r."cell_id" = e."run_id" '
    f'WHERE r."cell_id" = {_CELL_ID} AND r."status" = \'pending\' ORDER BY e."event_id" LIMIT %s'
)
_LIVE_HOOKS = f'SELECT "hook_id", "token" FROM "{_HOOK}" WHERE "run_id" = {_CELL_ID}'
_DELETE_HOOK = f'DELETE FROM "{_HOOK}" WHERE "run_id" = %s AND "hook_id" = %s'
_DELETE_HOOKS = f'DELETE FROM "{_HOOK}" WHERE "run_id" = %s'
_INSERT_MARKER = f'INSERT INTO "{_MARKER}" ("run_id", "hook_id", "event_id") VALUES (%s, %s, %s)'
_INSERT_EVENT = (
    f'INSERT INTO "{_EVENT}" ("run_id", "event_id", "sequence", "event_type", "correlation_id", "created_at", "body") '
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
_GET_RUN = (
    f'SELECT {Run.select_columns("r")} FROM "{_RUN}" r JOIN "{_CELL}" c ON c."id" = r."cell_id" '
    'WHERE c."name" = %s AND NOT c."expired"'
)
_GET_STEP = f'SELECT {Step.select_columns("s")} FROM "{_STEP}" s WHERE s."run_id" = {_CELL_ID} AND s."step_id" = %s'
_GET_EVENT = f'SELECT "body" FROM "{_EVENT}" WHERE "run_id" = {_CELL_ID} AND "event_id" = %s'

_EVENT_ID_PREFIX_LEN = len("wevt_z")


@lru_cache(maxsize=None)
def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    return f'INSERT INTO "{table}" ({names}) VALUES ({", ".join(["%s"] * len(columns))})'


@lru_cache(maxsize=None)
def _update_sql(table: str, columns: tuple[str, ...], keys: tuple[str, ...]) -> str:
    sets = ", ".join(f'"{c}" = %s' for c in columns)
    where = " AND ".join(f'"{k}" = %s' for k in keys)
    return f'UPDATE "{table}" SET {sets} WHERE {where}'


@lru_cache(maxsize=None)
def _with_counter(sql: str) -> str:
    """``sql`` (a write) preceded by the event counter update as a CTE (PostgreSQL)."""
    return f"WITH counter AS ({_SAVE_SEQUENCE}) {sql}"


@lru_cache(maxsize=None)
def _load_sql(run: str | None, step: bool, hook: bool, marker: bool) -> str:
    """The read half of ``LockedRunCell.open``: the cell row joined to what the event needs.

    Join parameters come first in the order step id, hook id, hook id
    (marker), then the cell name.
    """
    columns = ['c."id"', 'c."event_sequence"', 'c."expired"']
    joins = []
    if run is not None:
        columns.append(Run.select_columns("r") if run == "full" else 'r."status", r."spec_version"')
        joins.append(f'LEFT JOIN "{_RUN}" r ON r."cell_id" = c."id"')
    if step:
        columns.append(Step.select_columns("s"))
        joins.append(f'LEFT JOIN "{_STEP}" s ON s."run_id" = c."id" AND s."step_id" = %s')
    if hook:
        columns.append(Hook.select_columns("h"))
        joins.append(f'LEFT JOIN "{_HOOK}" h ON h."run_id" = c."id" AND h."hook_id" = %s')
    if marker:
        columns.append('m."event_id"')
        joins.append(f'LEFT JOIN "{_MARKER}" m ON m."run_id" = c."id" AND m."hook_id" = %s')
    return f'SELECT {", ".join(columns)} FROM "{_CELL}" c {" ".join(joins)} WHERE c."name" = %s'


@lru_cache(maxsize=None)
def _page_sql(table: str, select: str, key: str, after_cursor: bool, descending: bool) -> str:
    bound = f' AND t."{key}" {"<" if descending else ">"} %s' if after_cursor else ""
    order = "DESC" if descending else "ASC"
    return (
        f'SELECT t."{key}", {select} FROM "{table}" t WHERE t."run_id" = {_CELL_ID}{bound} '
        f'ORDER BY t."{key}" {order} LIMIT %s'
    )


def database() -> Any:
    """Django's default connection itself (``django.db.connection`` is a proxy that
    looks the thread's connection up again on every attribute access)."""
    return connections[DEFAULT_DB_ALIAS]


def batches_statements(db: Any) -> bool:
    """Whether several statements can travel in one query string (one round trip).

    True on PostgreSQL with Django's default client-side parameter binding
    (psycopg then uses the simple query protocol, which accepts
    ``stmt; stmt; …``); False on SQLite (in-process, nothing to save) and
    with ``OPTIONS["server_side_binding"]``.
    """
    return db.vendor == "postgresql" and db.settings_dict["OPTIONS"].get("server_side_binding") is not True


# -- prepared statements (PostgreSQL) ----------------------------------------------------------
#
# Planning costs PostgreSQL more CPU than running these point lookups and
# single-row writes (a 3-table join: ~0.2 ms to plan, well under 0.1 ms to
# run). In batched mode every statement of the run cell is therefore a
# session-level prepared statement (``PREPARE wc_run_<hash> AS …``), created
# on a connection the first time it is needed (its own round trip, once per
# connection) and then sent as ``EXECUTE wc_run_<hash>(…)`` — still several
# to one query string. Prepared statements survive rollbacks. Should one
# disappear behind our back (``DISCARD ALL`` by a pooler, a manual
# ``DEALLOCATE``), the EXECUTE fails with SQLSTATE 26000: the connection's
# bookkeeping is dropped, a read is retried once, ``RunCell.apply_event``
# retries the whole (rolled back) call once. A transaction-pooling pgbouncer
# would move the session under us between transactions: run it in session
# mode, or set ``server_side_binding`` (which turns batching off).

#: Statements that are sent as they are (utility statements cannot be prepared).
_UNPREPARED = frozenset({"BEGIN", "COMMIT", "ROLLBACK"})
#: psycopg connection -> names of the statements prepared on it.
_PREPARED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
_PLACEHOLDER = re.compile(r"%s")
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


@lru_cache(maxsize=None)
def _prepared_form(sql: str) -> tuple[str, str, int]:
    """``(name, PREPARE statement, parameter count)`` of ``sql`` (``%s`` placeholders)."""
    name = "wc_run_" + hashlib.sha1(sql.encode()).hexdigest()[:20]
    count = 0

    def number(_match: re.Match) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    body = _PLACEHOLDER.sub(number, sql)
    return name, f"PREPARE {name} AS {body}", count


@lru_cache(maxsize=None)
def _execute_text(sql: str) -> str:
    """``EXECUTE name(%s, …)`` of ``sql``, or ``sql`` itself for utility statements."""
    if sql in _UNPREPARED:
        return sql
    name, _, count = _prepared_form(sql)
    return f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"


def is_missing_prepared_statement(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is PostgreSQL's "prepared statement … does not exist" (26000)."""
    for err in (exc, exc.__cause__):
        if getattr(err, "sqlstate", None) == "26000":
            return True
    return False


def _prepare_missing(db: Any, cur: Any, sqls: Iterable[str]) -> None:
    """Prepare on ``db``'s connection every statement of ``sqls`` it does not have yet."""
    pg = db.connection
    names = _PREPARED.get(pg)
    if names is None:
        names = _PREPARED[pg] = set()
    missing = {}
    for sql in sqls:
        if sql not in _UNPREPARED:
            name, prepare, _ = _prepared_form(sql)
            if name not in names:
                missing[name] = prepare
    if not missing:
        return
    try:
        cur.execute("; ".join(missing.values()))
    except Exception:
        # Some may exist already (bookkeeping lost): learn what this session has, retry.
        if db.in_atomic_block or pg.info.transaction_status != _IDLE:
            raise
        cur.execute("SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'wc_run_')")
        names.clear()
        names.update(row[0] for row in cur.fetchall())
        todo = [prepare for name, prepare in missing.items() if name not in names]
        if todo:
            cur.execute("; ".join(todo))
    names.update(missing)


@contextmanager
def _cursor(db: Any, batched: bool) -> Iterator[Any]:
    """A cursor on Django's connection (same transaction and autocommit state).

    Batched (PostgreSQL) and when nothing records queries: a bare psycopg
    client-side-binding cursor, errors translated to ``django.db``
    exceptions — Django's cursor wrapper costs about as much CPU as the
    statements it wraps. When queries are being recorded (``DEBUG``,
    ``CaptureQueriesContext``) or execute wrappers are installed, Django's
    own cursor, so they see these statements too.
    """
    if not batched or db.queries_logged or db.execute_wrappers:
        with db.cursor() as cur:
            yield cur
        return
    import psycopg

    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors, psycopg.ClientCursor(db.connection) as cur:
        yield cur


def _execute(db: Any, statements: list[tuple[str, Any, bool]], batched: bool) -> list[list[tuple]]:
    """Run ``(sql, params, wants_rows)`` in order; returns the rows of those that want them.

    ``batched``: one round trip of prepared statements (``batches_statements``).
    On an error the statements after the failing one do not run.
    """
    fetched: list[list[tuple]] = []
    with _cursor(db, batched) as cur:
        if batched:
            _prepare_missing(db, cur, (sql for sql, _, _ in statements))
            text = "; ".join(_execute_text(sql) for sql, _, _ in statements)
            try:
                cur.execute(text, [p for _, ps, _ in statements for p in ps])
            except Exception as exc:
                if is_missing_prepared_statement(exc):
                    _PREPARED.pop(db.connection, None)
                raise
            for i, (_, _, wants_rows) in enumerate(statements):
                if i:
                    cur.nextset()
                if wants_rows:
                    fetched.append(cur.fetchall())
        else:
            for sql, params, wants_rows in statements:
                cur.execute(sql, params or None)
                if wants_rows:
                    fetched.append(cur.fetchall())
    return fetched


def _query(db: Any, sql: str, params: list[Any]) -> list[tuple]:
    """The rows of one statement (prepared on PostgreSQL; retried once if it vanished)."""
    batched = batches_statements(db)
    try:
        return _execute(db, [(sql, params, True)], batched)[0]
    except Exception as exc:
        if not (batched and is_missing_prepared_statement(exc)) or db.in_atomic_block:
            raise
        return _execute(db, [(sql, params, True)], batched)[0]


def _db_values(db: Any, values: Iterable[Any]) -> list[Any]:
    """Column values as the database driver takes them (SQLite wants naive UTC text for datetimes)."""
    adapt = db.ops.adapt_datetimefield_value
    return [adapt(v) if isinstance(v, datetime) else v for v in values]


# --------------------------------------------------------------------------- reads


def read_run(name: str) -> dict[str, Any] | None:
    """The run entity of cell ``name``, or None (one statement, no lock)."""
    rows = _query(database(), _GET_RUN, [name])
    return Run.entity_from_row(name, rows[0]) if rows else None


def read_step(name: str, step_id: str) -> dict[str, Any] | None:
    """Step ``step_id`` of cell ``name``, or None."""
    rows = _query(database(), _GET_STEP, [name, step_id])
    return Step.entity_from_row(name, rows[0]) if rows else None


def read_event(name: str, event_id: str) -> dict[str, Any] | None:
    """Event ``event_id`` of cell ``name``, decoded, or None."""
    rows = _query(database(), _GET_EVENT, [name, event_id])
    return codec.decode(rows[0][0]) if rows else None


#: ``list_kind -> (table, key column, row -> entity)`` of ``read_page``.
_PAGES: dict[str, tuple[type, str, str]] = {
    "events": (Event, "event_id", 't."body"'),
    "steps": (Step, "sort_key", Step.select_columns("t")),
    "hooks": (Hook, "sort_key", Hook.select_columns("t")),
}


def read_page(list_kind: str, name: str, cursor: str | None, descending: bool, fetch: int) -> list[tuple[str, dict]]:
    """Up to ``fetch`` ``(key, entity)`` of cell ``name`` ordered by key, strictly after ``cursor``.

    ``list_kind`` is ``events`` (key = event id), ``steps`` or ``hooks``
    (key = ``<ISO createdAt>:<id>``); keys compare bytewise (§4.0 P1/P2).
    """
    model, key, select = _PAGES[list_kind]
    sql = _page_sql(model._meta.db_table, select, key, cursor is not None, descending)
    params: list[Any] = [name] if cursor is None else [name, cursor]
    rows = _query(database(), sql, params + [fetch])
    if model is Event:
        return [(row[0], codec.decode(row[1])) for row in rows]
    return [(row[0], model.entity_from_row(name, row[1:])) for row in rows]


# --------------------------------------------------------------------------- the locked cell

_UNREAD: Any = object()


class LockedRunCell:
    """One run cell, locked for one ``applyEvent`` call: the rows it read and the writes it queued.

    ``open`` takes the cell's row lock and reads, in the same round trip,
    everything the event type needs: the run (all columns, or only status and
    spec version), the step or hook its ``correlationId`` names, the hook's
    marker, the live hooks a terminal transition releases, the ``run_started``
    preload. Writes are queued and sent together by ``finish``. Any other
    read (none on the paths above) flushes the queued writes first, so it
    sees them. ``event_machine`` reads and writes only through this object.

    Transactions (DESIGN.md rules 1–2):

    * ``inline=True`` — PostgreSQL on an autocommit connection (an RPC
      request; ``can_begin_inline``). ``BEGIN`` travels in the query string
      of ``open`` and ``COMMIT`` in the one of ``finish``: two round trips
      per event. Each statement of a multi-statement string takes its own
      snapshot (READ COMMITTED), so the reads after the ``FOR UPDATE`` see
      everything the previous holder of the lock committed. The caller must
      call ``abort`` when anything fails between ``open`` and ``finish``.
    * ``inline=False`` — inside the caller's ``transaction.atomic()`` (tests,
      the admin, SQLite always): statements are still batched on PostgreSQL,
      one by one on SQLite, whose IMMEDIATE transaction already excludes
      every other writer (no ``FOR UPDATE`` there).

    Attributes:
        name: the cell name (= run id).
        pk: the cell row's id, None when the cell has no row (and then no run).
        event_sequence: the event counter as stored (``save_event_sequence`` updates it).
    """

    def __init__(self, name: str, *, inline: bool = False):
        self.name = name
        self.pk: int | None = None
        self.event_sequence = 0
        self.expired = False  # the cell's retention fence (cells.lifecycle); checked by RunCell
        self._db = db = database()
        self._inline = inline
        self._batched = batches_statements(db)
        self._postgres = db.vendor == "postgresql"
        self._writes: list[tuple[str, list[Any], bool]] = []
        self._run: Any = _UNREAD
        self._run_full = False
        self._steps: dict[str, dict[str, Any] | None] = {}
        self._hooks: dict[str, dict[str, Any] | None] = {}
        self._markers: dict[str, bool] = {}
        self._live_hooks: list[tuple[str, str]] | None = None
        self._first_bodies: list[str] | None = None
        self._new_bodies: list[str] = []

    @staticmethod
    def can_begin_inline() -> bool:
        """Whether ``inline=True`` is possible: PostgreSQL, batching, autocommit, no atomic block."""
        db = database()
        return batches_statements(db) and not db.in_atomic_block and db.get_autocommit()

    # -- lock and read ---------------------------------------------------------------------

    def open(
        self,
        *,
        create: bool = False,
        run: str | None = "full",
        step_id: str | None = None,
        hook_id: str | None = None,
        marker: bool = False,
        live_hooks: bool = False,
        first_events: int | None = None,
    ) -> None:
        """Lock the cell (creating its row first when ``create``) and read what is asked for.

        Args:
            create: insert the cell row if it is missing (events that may create the run).
            run: ``"full"``, ``"slim"`` (status and spec version) or None (not read).
            step_id, hook_id: also read this step / hook (storable ids only).
            marker: also read the ``hookevent:`` marker of ``hook_id``.
            live_hooks: also read ``(hookId, token)`` of every live hook.
            first_events: also read the bodies of the first this-many events (when the
                run is pending: the only case that returns them; otherwise
                ``first_events()`` reads them itself).
        """
        statements: list[tuple[str, Any, bool]] = []
        if self._inline:
            statements.append(("BEGIN", (), False))
        if create:
            statements.append((_CREATE_CELL, (self.name, self.name), False))
        if self._postgres:
            statements.append((_LOCK_CELL, (self.name,), False))
        marker = marker and hook_id is not None
        params = [k for k in (step_id, hook_id) if k is not None] + ([hook_id] if marker else []) + [self.name]
        statements.append((_load_sql(run, step_id is not None, hook_id is not None, marker), params, True))
        if first_events is not None:
            statements.append((_FIRST_EVENTS_IF_PENDING, (self.name, first_events), True))
        if live_hooks:
            statements.append((_LIVE_HOOKS, (self.name,), True))
        results = _execute(self._db, statements, self._batched)

        row = results[0][0] if results[0] else None
        if row is None:  # no cell row: nothing of this run exists
            self._run, self._run_full = None, True
            self._live_hooks, self._first_bodies = [], []
            if step_id is not None:
                self._steps[step_id] = None
            if hook_id is not None:
                self._hooks[hook_id] = None
                self._markers[hook_id] = False
            return
        self.pk, self.event_sequence, self.expired = row[0], row[1], bool(row[2])
        at = 3
        if run is not None:
            width = len(Run.MEMBERS) if run == "full" else 2
            values = row[at:at + width]
            at += width
            if values[0] is None:
                self._run, self._run_full = None, True
            elif run == "full":
                self._run, self._run_full = Run.entity_from_row(self.name, values), True
            else:
                slim = {"runId": self.name, "status": values[0]}
                if values[1] is not None:
                    slim["specVersion"] = json_number(values[1])
                self._run = slim
        if step_id is not None:
            values = row[at:at + len(Step.MEMBERS)]
            at += len(Step.MEMBERS)
            self._steps[step_id] = None if values[0] is None else Step.entity_from_row(self.name, values)
        if hook_id is not None:
            values = row[at:at + len(Hook.MEMBERS)]
            at += len(Hook.MEMBERS)
            self._hooks[hook_id] = None if values[0] is None else Hook.entity_from_row(self.name, values)
        if marker:
            self._markers[hook_id] = row[at] is not None
        rest = 1
        if first_events is not None:
            loaded = self._run
            if loaded is None or (loaded is not _UNREAD and loaded["status"] == "pending"):
                self._first_bodies = [r[0] for r in results[rest]]  # complete: the run cannot change under the lock
            rest += 1
        if live_hooks:
            self._live_hooks = [(r[0], r[1]) for r in results[rest]]

    def load_run(self, full: bool = True) -> dict[str, Any] | None:
        """The run entity (only ``runId``, ``status``, ``specVersion`` when not ``full``), or None."""
        if self._run is _UNREAD or (full and not self._run_full and self._run is not None):
            self._flush()
            self._run, self._run_full = read_run(self.name), True
        return self._run

    def load_step(self, step_id: str) -> dict[str, Any] | None:
        if step_id not in self._steps:
            self._flush()
            self._steps[step_id] = read_step(self.name, step_id) if _storable(step_id) else None
        return self._steps[step_id]

    def load_hook(self, hook_id: str) -> dict[str, Any] | None:
        if hook_id not in self._hooks:
            found = None
            if _storable(hook_id) and self.pk is not None:
                self._flush()
                rows = _query(self._db, f'SELECT {Hook.select_columns("h")} FROM "{_HOOK}" h '
                              'WHERE h."run_id" = %s AND h."hook_id" = %s', [self.pk, hook_id])
                found = Hook.entity_from_row(self.name, rows[0]) if rows else None
            self._hooks[hook_id] = found
        return self._hooks[hook_id]

    def has_marker(self, hook_id: str) -> bool:
        """Whether a hook ``hook_id`` was ever created on this run (``hookevent:`` marker)."""
        if hook_id not in self._markers:
            found = False
            if _storable(hook_id) and self.pk is not None:
                self._flush()
                found = bool(_query(self._db, f'SELECT 1 FROM "{_MARKER}" WHERE "run_id" = %s AND "hook_id" = %s',
                                    [self.pk, hook_id]))
            self._markers[hook_id] = found
        return self._markers[hook_id]

    def first_events(self, limit: int) -> list[dict[str, Any]]:
        """The first ``limit`` events of the log, this call's new ones included, decoded."""
        if self._first_bodies is None:
            self._flush()
            bodies = [] if self.pk is None else [r[0] for r in _query(self._db, _FIRST_EVENTS, [self.name, limit])]
        else:
            bodies = (self._first_bodies + self._new_bodies)[:limit]
        return [codec.decode(body) for body in bodies]

    # -- queued writes ---------------------------------------------------------------------

    def _write(self, sql: str, params: list[Any]) -> None:
        if self.pk is None:  # only run_created / run_started write to a new cell, and they create its row
            raise RuntimeError(f"run cell {self.name!r} has no row to write to")
        self._writes.append((sql, params, False))

    def create_run(self, run: dict[str, Any]) -> None:
        columns = Run.entity_columns(run)
        self._write(_insert_sql(_RUN, ("cell_id", *columns)), [self.pk, *_db_values(self._db, columns.values())])
        self._run, self._run_full = run, True

    def update_run(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Write the members of ``new`` that differ from ``old`` (big unchanged payloads are not resent)."""
        columns = Run.entity_columns(new, Run.changed_members(old, new))
        if columns:
            sql = _update_sql(_RUN, tuple(columns), ("cell_id",))
            self._write(sql, [*_db_values(self._db, columns.values()), self.pk])
        self._run, self._run_full = new, True

    def create_step(self, step: dict[str, Any]) -> None:
        columns = Step.entity_columns(step)
        sort_key = creation_sort_key(step["createdAt"], step["stepId"])
        sql = _insert_sql(_STEP, ("run_id", "sort_key", *columns))
        self._write(sql, [self.pk, sort_key, *_db_values(self._db, columns.values())])
        self._steps[step["stepId"]] = step

    def update_step(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Like ``update_run``: only the members that changed."""
        columns = Step.entity_columns(new, Step.changed_members(old, new))
        if columns:
            sql = _update_sql(_STEP, tuple(columns), ("run_id", "step_id"))
            self._write(sql, [*_db_values(self._db, columns.values()), self.pk, old["stepId"]])
        self._steps[old["stepId"]] = new

    def create_hook(self, hook: dict[str, Any], event_id: str) -> None:
        """Store a new live hook and its never-deleted ``hookevent:`` marker."""
        columns = Hook.entity_columns(hook)
        sort_key = creation_sort_key(hook["createdAt"], hook["hookId"])
        sql = _insert_sql(_HOOK, ("run_id", "sort_key", *columns))
        self._write(sql, [self.pk, sort_key, *_db_values(self._db, columns.values())])
        self._write(_INSERT_MARKER, [self.pk, hook["hookId"], event_id])
        self._hooks[hook["hookId"]] = hook
        self._markers[hook["hookId"]] = True

    def delete_hook(self, hook_id: str) -> None:
        self._write(_DELETE_HOOK, [self.pk, hook_id])
        self._hooks[hook_id] = None

    def release_all_hooks(self) -> list[tuple[str, str]]:
        """Delete every live hook; ``(hookId, token)`` of each in ``hook:<id>`` key order (§5.6)."""
        hooks = self._live_hooks
        if hooks is None:
            self._flush()
            hooks = [] if self.pk is None else [(r[0], r[1]) for r in _query(self._db, _LIVE_HOOKS, [self.name])]
        hooks = sorted(hooks)
        if hooks:
            self._write(_DELETE_HOOKS, [self.pk])
            self._hooks = {hook_id: None for hook_id, _ in hooks}
        self._live_hooks = []
        return hooks

    def store_event(self, event: dict[str, Any]) -> None:
        """Append a validated event to the log."""
        event_id = event["eventId"]
        body = codec.encode(event)
        self._write(_INSERT_EVENT, [
            self.pk, event_id, int(event_id[_EVENT_ID_PREFIX_LEN:]), event["eventType"],
            event.get("correlationId"), self._db.ops.adapt_datetimefield_value(event["createdAt"]), body,
        ])
        self._new_bodies.append(body)

    def save_event_sequence(self, sequence: int) -> None:
        self._write(_SAVE_SEQUENCE, [sequence, self.pk])
        self.event_sequence = sequence

    # -- ending ----------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._writes:
            writes, self._writes = self._writes, []
            _execute(self._db, writes, self._batched)

    def finish(self) -> None:
        """Send the queued writes; ``inline``: with ``COMMIT`` in the same round trip.

        On PostgreSQL the event counter update rides along with the write
        before it as a data-modifying CTE: one statement fewer per event.
        """
        statements, self._writes = self._writes, []
        if self._postgres and len(statements) >= 2 and statements[-1][0] == _SAVE_SEQUENCE:
            counter, (sql, params, _) = statements.pop(), statements.pop()
            statements.append((_with_counter(sql), [*counter[1], *params], False))
        if self._inline:
            statements.append(("COMMIT", (), False))
        if statements:
            _execute(self._db, statements, self._batched)

    def abort(self) -> None:
        """Drop the queued writes; ``inline``: roll back the transaction ``open`` began."""
        self._writes = []
        if not self._inline:
            return
        db = self._db
        pg = db.connection
        if pg is None or pg.closed:
            return
        try:
            with db.wrap_database_errors:
                pg.rollback()  # no-op when no transaction is open
        except Exception:  # noqa: BLE001 - the state of the connection is unknown: drop it
            db.close()
