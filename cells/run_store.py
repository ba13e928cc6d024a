"""The persistence engine of the runs cell: rows <-> entities, its SQL, and the locked cell.

* ``RowMapper`` turns a ``Run``/``Step``/``Hook`` row into the wire-shaped
  entity dict and back, member by member (the column map is the model's
  ``MEMBERS``/``PAYLOADS``/``CONSTANTS``, ``cells.models.runs``).
* The SQL text of the run cell: fixed statements, table names from the
  models' ``_meta`` (``worldcell.sql.table``), run by ``worldcell.sql``
  (PostgreSQL: prepared statements, several per round trip).
* ``read_run`` / ``read_step`` / ``read_event`` / ``read_page``: the lock-free
  reads of ``cells.runs.RunCell`` (one statement each).
* ``LockedRunCell``: the unit of work of one ``applyEvent`` call — the cell's
  row lock, the rows read with it, the writes queued until ``finish``.

Fault injection: the writes call ``cells.faults.point(<method name>)`` first,
a no-op unless a test armed it (docs/architecture.md rule 2: a crash at any
line leaves the cell as it was).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from django.db import models

from worldcell import codec, sql
from worldcell.keys import storable_text

from . import faults
from .models.runs import EntityRow, Event, Hook, HookMarker, Run, RunCellState, Step, creation_sort_key

__all__ = ["LockedRunCell", "RowMapper", "json_number", "read_event", "read_page", "read_run", "read_step"]


# =========================================================================== rows <-> entities

# How ``RowMapper.entity`` turns a column value into a member value.
_PLAIN, _PAYLOAD, _TIME, _NUMBER, _BOOL = range(5)
_MISSING: Any = object()


def json_number(value: float) -> int | float:
    """A stored float as the JSON number the client sent (3.0 -> 3)."""
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


class RowMapper:
    """Rows of one entity model (``Run``, ``Step``, ``Hook``) as wire entities, member by member.

    The model's ``MEMBERS`` maps each wire member to its column, in the wire
    order; members in ``PAYLOADS`` are stored as codec-encoded text. A NULL
    column is an absent member, so an entity never carries ``null`` (§3.5).
    ``CONSTANTS`` are members every entity of the kind carries unchanged.
    """

    def __init__(self, model: type[EntityRow]):
        self.model = model
        self.members: dict[str, str] = model.MEMBERS
        self.payloads: frozenset[str] = model.PAYLOADS
        self.constants: dict[str, Any] = model.CONSTANTS
        self.width = len(self.members)
        self._kinds: tuple[tuple[str, int], ...] | None = None

    def kinds(self) -> tuple[tuple[str, int], ...]:
        """``(member, kind)`` in ``MEMBERS`` order: how ``entity`` reads each column."""
        if self._kinds is None:
            out = []
            for member, column in self.members.items():
                field = self.model._meta.get_field(column)
                if member in self.payloads:
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
            self._kinds = tuple(out)
        return self._kinds

    def entity(self, run_id: str, values: Iterable[Any]) -> dict[str, Any]:
        """The entity out of raw column values in ``MEMBERS`` order (``select``).

        Works on what either database returns: aware (PostgreSQL) or naive
        UTC (SQLite) datetimes, 0/1 or bools, floats for spec versions.
        """
        entity: dict[str, Any] = {"runId": run_id}
        for (member, kind), value in zip(self.kinds(), values):
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
        if self.constants:
            entity.update(self.constants)
        return entity

    def changed(self, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        """Members of ``new`` that must be written over ``old``, in ``MEMBERS`` order.

        Payload members count as changed unless they are the very same object
        (so a big unchanged input is neither re-encoded nor rewritten, and never
        compared); other members unless equal with the same type.
        """
        out = []
        for member in self.members:
            a, b = old.get(member, _MISSING), new.get(member, _MISSING)
            if a is b or (member not in self.payloads and type(a) is type(b) and a == b):
                continue
            out.append(member)
        return out

    def select(self, alias: str) -> str:
        """``alias."col", …`` for every member column, in ``MEMBERS`` order."""
        return ", ".join(f'{alias}."{column}"' for column in self.members.values())

    def columns(self, entity: dict[str, Any], members: Iterable[str] | None = None) -> dict[str, Any]:
        """Column values of the members of a validated ``entity`` (all of them, or only ``members``).

        Members that have no column (``runId``, the constants) are skipped.
        """
        out: dict[str, Any] = {}
        for member in self.members if members is None else [m for m in members if m in self.members]:
            value = entity.get(member)
            if value is not None and member in self.payloads:
                value = codec.encode(value)
            out[self.members[member]] = value
        return out


RUNS, STEPS, HOOKS = RowMapper(Run), RowMapper(Step), RowMapper(Hook)


# =========================================================================== SQL of the run cell
#
# Fixed text (``worldcell.sql``): identifiers double-quoted, ``%s`` placeholders.

_CELL = sql.table(RunCellState)
_RUN = sql.table(Run)
_STEP = sql.table(Step)
_HOOK = sql.table(Hook)
_MARKER = sql.table(HookMarker)
_EVENT = sql.table(Event)

#: The id of the cell named by the next parameter.
#: (None for an expired run: its data may be half deleted, docs/lifecycle.md §2)
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
    f'SELECT {RUNS.select("r")} FROM "{_RUN}" r JOIN "{_CELL}" c ON c."id" = r."cell_id" '
    'WHERE c."name" = %s AND NOT c."expired"'
)
_GET_STEP = f'SELECT {STEPS.select("s")} FROM "{_STEP}" s WHERE s."run_id" = {_CELL_ID} AND s."step_id" = %s'
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
def _with_counter(write: str) -> str:
    """``sql`` (a write) preceded by the event counter update as a CTE (PostgreSQL)."""
    return f"WITH counter AS ({_SAVE_SEQUENCE}) {write}"


@lru_cache(maxsize=None)
def _load_sql(run: str | None, step: bool, hook: bool, marker: bool) -> str:
    """The read half of ``LockedRunCell.open``: the cell row joined to what the event needs.

    Join parameters come first in the order step id, hook id, hook id
    (marker), then the cell name.
    """
    columns = ['c."id"', 'c."event_sequence"', 'c."expired"']
    joins = []
    if run is not None:
        columns.append(RUNS.select("r") if run == "full" else 'r."status", r."spec_version"')
        joins.append(f'LEFT JOIN "{_RUN}" r ON r."cell_id" = c."id"')
    if step:
        columns.append(STEPS.select("s"))
        joins.append(f'LEFT JOIN "{_STEP}" s ON s."run_id" = c."id" AND s."step_id" = %s')
    if hook:
        columns.append(HOOKS.select("h"))
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



# --------------------------------------------------------------------------- reads


def read_run(name: str) -> dict[str, Any] | None:
    """The run entity of cell ``name``, or None (one statement, no lock)."""
    rows = sql.query(sql.database(), _GET_RUN, [name])
    return RUNS.entity(name, rows[0]) if rows else None


def read_step(name: str, step_id: str) -> dict[str, Any] | None:
    """Step ``step_id`` of cell ``name``, or None."""
    rows = sql.query(sql.database(), _GET_STEP, [name, step_id])
    return STEPS.entity(name, rows[0]) if rows else None


def read_event(name: str, event_id: str) -> dict[str, Any] | None:
    """Event ``event_id`` of cell ``name``, decoded, or None."""
    rows = sql.query(sql.database(), _GET_EVENT, [name, event_id])
    return codec.decode(rows[0][0]) if rows else None


#: ``list_kind -> (table, key column, selected columns, mapper or None for event bodies)`` of ``read_page``.
_PAGES: dict[str, tuple[str, str, str, RowMapper | None]] = {
    "events": (_EVENT, "event_id", 't."body"', None),
    "steps": (_STEP, "sort_key", STEPS.select("t"), STEPS),
    "hooks": (_HOOK, "sort_key", HOOKS.select("t"), HOOKS),
}


def read_page(list_kind: str, name: str, cursor: str | None, descending: bool, fetch: int) -> list[tuple[str, dict]]:
    """Up to ``fetch`` ``(key, entity)`` of cell ``name`` ordered by key, strictly after ``cursor``.

    ``list_kind`` is ``events`` (key = event id), ``steps`` or ``hooks``
    (key = ``<ISO createdAt>:<id>``); keys compare bytewise (§4.0 P1/P2).
    """
    table, key, select, mapper = _PAGES[list_kind]
    text = _page_sql(table, select, key, cursor is not None, descending)
    params: list[Any] = [name] if cursor is None else [name, cursor]
    rows = sql.query(sql.database(), text, params + [fetch])
    if mapper is None:
        return [(row[0], codec.decode(row[1])) for row in rows]
    return [(row[0], mapper.entity(name, row[1:])) for row in rows]


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

    Transactions (docs/architecture.md rules 1–2):

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
        self._db = db = sql.database()
        self._inline = inline
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
        db = sql.database()
        return sql.batches_statements(db) and not db.in_atomic_block and db.get_autocommit()

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
        results = sql.execute(self._db, statements)

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
            width = RUNS.width if run == "full" else 2
            values = row[at:at + width]
            at += width
            if values[0] is None:
                self._run, self._run_full = None, True
            elif run == "full":
                self._run, self._run_full = RUNS.entity(self.name, values), True
            else:
                slim = {"runId": self.name, "status": values[0]}
                if values[1] is not None:
                    slim["specVersion"] = json_number(values[1])
                self._run = slim
        if step_id is not None:
            values = row[at:at + STEPS.width]
            at += STEPS.width
            self._steps[step_id] = None if values[0] is None else STEPS.entity(self.name, values)
        if hook_id is not None:
            values = row[at:at + HOOKS.width]
            at += HOOKS.width
            self._hooks[hook_id] = None if values[0] is None else HOOKS.entity(self.name, values)
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
            self._steps[step_id] = read_step(self.name, step_id) if storable_text(step_id) else None
        return self._steps[step_id]

    def load_hook(self, hook_id: str) -> dict[str, Any] | None:
        if hook_id not in self._hooks:
            found = None
            if storable_text(hook_id) and self.pk is not None:
                self._flush()
                rows = sql.query(self._db, f'SELECT {HOOKS.select("h")} FROM "{_HOOK}" h '
                              'WHERE h."run_id" = %s AND h."hook_id" = %s', [self.pk, hook_id])
                found = HOOKS.entity(self.name, rows[0]) if rows else None
            self._hooks[hook_id] = found
        return self._hooks[hook_id]

    def has_marker(self, hook_id: str) -> bool:
        """Whether a hook ``hook_id`` was ever created on this run (``hookevent:`` marker)."""
        if hook_id not in self._markers:
            found = False
            if storable_text(hook_id) and self.pk is not None:
                self._flush()
                found = bool(sql.query(self._db, f'SELECT 1 FROM "{_MARKER}" WHERE "run_id" = %s AND "hook_id" = %s',
                                    [self.pk, hook_id]))
            self._markers[hook_id] = found
        return self._markers[hook_id]

    def first_events(self, limit: int) -> list[dict[str, Any]]:
        """The first ``limit`` events of the log, this call's new ones included, decoded."""
        if self._first_bodies is None:
            self._flush()
            bodies = [] if self.pk is None else [r[0] for r in sql.query(self._db, _FIRST_EVENTS, [self.name, limit])]
        else:
            bodies = (self._first_bodies + self._new_bodies)[:limit]
        return [codec.decode(body) for body in bodies]

    # -- queued writes ---------------------------------------------------------------------

    def _write(self, statement: str, params: list[Any]) -> None:
        if self.pk is None:  # only run_created / run_started write to a new cell, and they create its row
            raise RuntimeError(f"run cell {self.name!r} has no row to write to")
        self._writes.append((statement, params, False))

    def create_run(self, run: dict[str, Any]) -> None:
        faults.point("create_run")
        columns = RUNS.columns(run)
        self._write(_insert_sql(_RUN, ("cell_id", *columns)), [self.pk, *sql.db_values(self._db, columns.values())])
        self._run, self._run_full = run, True

    def update_run(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Write the members of ``new`` that differ from ``old`` (big unchanged payloads are not resent)."""
        faults.point("update_run")
        columns = RUNS.columns(new, RUNS.changed(old, new))
        if columns:
            statement = _update_sql(_RUN, tuple(columns), ("cell_id",))
            self._write(statement, [*sql.db_values(self._db, columns.values()), self.pk])
        self._run, self._run_full = new, True

    def create_step(self, step: dict[str, Any]) -> None:
        faults.point("create_step")
        columns = STEPS.columns(step)
        sort_key = creation_sort_key(step["createdAt"], step["stepId"])
        statement = _insert_sql(_STEP, ("run_id", "sort_key", *columns))
        self._write(statement, [self.pk, sort_key, *sql.db_values(self._db, columns.values())])
        self._steps[step["stepId"]] = step

    def update_step(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Like ``update_run``: only the members that changed."""
        faults.point("update_step")
        columns = STEPS.columns(new, STEPS.changed(old, new))
        if columns:
            statement = _update_sql(_STEP, tuple(columns), ("run_id", "step_id"))
            self._write(statement, [*sql.db_values(self._db, columns.values()), self.pk, old["stepId"]])
        self._steps[old["stepId"]] = new

    def create_hook(self, hook: dict[str, Any], event_id: str) -> None:
        """Store a new live hook and its never-deleted ``hookevent:`` marker."""
        faults.point("create_hook")
        columns = HOOKS.columns(hook)
        sort_key = creation_sort_key(hook["createdAt"], hook["hookId"])
        statement = _insert_sql(_HOOK, ("run_id", "sort_key", *columns))
        self._write(statement, [self.pk, sort_key, *sql.db_values(self._db, columns.values())])
        self._write(_INSERT_MARKER, [self.pk, hook["hookId"], event_id])
        self._hooks[hook["hookId"]] = hook
        self._markers[hook["hookId"]] = True

    def delete_hook(self, hook_id: str) -> None:
        faults.point("delete_hook")
        self._write(_DELETE_HOOK, [self.pk, hook_id])
        self._hooks[hook_id] = None

    def release_all_hooks(self) -> list[tuple[str, str]]:
        """Delete every live hook; ``(hookId, token)`` of each in ``hook:<id>`` key order (§5.6)."""
        faults.point("release_all_hooks")
        hooks = self._live_hooks
        if hooks is None:
            self._flush()
            hooks = [] if self.pk is None else [(r[0], r[1]) for r in sql.query(self._db, _LIVE_HOOKS, [self.name])]
        hooks = sorted(hooks)
        if hooks:
            self._write(_DELETE_HOOKS, [self.pk])
            self._hooks = {hook_id: None for hook_id, _ in hooks}
        self._live_hooks = []
        return hooks

    def store_event(self, event: dict[str, Any]) -> None:
        """Append a validated event to the log."""
        faults.point("store_event")
        event_id = event["eventId"]
        body = codec.encode(event)
        self._write(_INSERT_EVENT, [
            self.pk, event_id, int(event_id[_EVENT_ID_PREFIX_LEN:]), event["eventType"],
            event.get("correlationId"), self._db.ops.adapt_datetimefield_value(event["createdAt"]), body,
        ])
        self._new_bodies.append(body)

    def save_event_sequence(self, sequence: int) -> None:
        faults.point("save_event_sequence")
        self._write(_SAVE_SEQUENCE, [sequence, self.pk])
        self.event_sequence = sequence

    # -- ending ----------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._writes:
            writes, self._writes = self._writes, []
            sql.execute(self._db, writes)

    def finish(self) -> None:
        """Send the queued writes; ``inline``: with ``COMMIT`` in the same round trip.

        On PostgreSQL the event counter update rides along with the write
        before it as a data-modifying CTE: one statement fewer per event.
        """
        faults.point("finish")
        statements, self._writes = self._writes, []
        if self._postgres and len(statements) >= 2 and statements[-1][0] == _SAVE_SEQUENCE:
            counter, (write, params, _) = statements.pop(), statements.pop()
            statements.append((_with_counter(write), [*counter[1], *params], False))
        if self._inline:
            statements.append(("COMMIT", (), False))
        if statements:
            sql.execute(self._db, statements)

    def abort(self) -> None:
        """Drop the queued writes; ``inline``: roll back the transaction ``open`` began."""
        self._writes = []
        if not self._inline:
            return
        sql.rollback_open_transaction(self._db)
