"""The one SQL executor of worldcell: fixed statement text on Django's own connection.

Hot paths run fixed SQL text instead of querysets: compiling a queryset costs
about 1 ms of CPU per statement, the statements themselves a fraction of
that. Identifiers are double-quoted and placeholders are ``%s``, valid on
PostgreSQL and SQLite; table names come from ``table(Model)``, values only
ever travel as parameters.

The interface (everything else here is private):

``database()``
    Django's default connection object itself (``django.db.connection`` is a
    proxy that looks the thread's connection up on every attribute access).
``table(model)``
    ``model._meta.db_table``, the only way a table name enters SQL text.
``batches_statements(db)``
    Whether several statements can travel in one query string (PostgreSQL
    with client-side binding).
``execute(db, statements)``
    Run ``[(sql, params, wants_rows), …]`` in order; returns one row list per
    statement with ``wants_rows``. PostgreSQL: ONE round trip, each statement
    a session-level prepared statement (see below); SQLite: one by one.
    Utility statements (``BEGIN``, ``COMMIT``, ``ROLLBACK``, ``SET …``) may
    be part of the list; they are sent as they are. Retried once,
    transparently, when a prepared statement vanished and nothing of the
    call can have run (autocommit, no transaction open).
``query(db, sql, params)``
    The rows of one statement (``execute`` of one).
``run_script(db, script, params)``
    A ``BEGIN; …; COMMIT`` string in one round trip, its statements prepared
    like ``execute``'s (``script_statements`` splits it); the rows of each
    statement that returns rows.
``execute_text(sql)`` / ``source_text(wire)``
    What goes on the wire for a prepared ``sql``, and back (for tests that
    recognise or inject faults by statement).
``rows(db, sql, params)`` / ``rowcount(db, sql, params)``
    One statement on Django's own cursor, not prepared (for statements whose
    text varies with the input, e.g. ``IN (%s, …)`` lists, and callers that
    want Django's query log): its rows (``[]`` for none), or the number of
    rows it changed.
``is_missing_prepared_statement(exc)``
    Whether ``exc`` is PostgreSQL's SQLSTATE 26000 (then everything the
    failed transaction did was rolled back; a caller that opened the
    transaction itself may retry the whole call once).
``rollback_open_transaction(db)``
    After a failure inside a transaction that a ``BEGIN`` of ``execute``
    opened: roll it back (or drop a broken connection).
``db_values(db, values)``
    Column values as the driver takes them (SQLite: naive UTC datetimes).
``binary_cursor(db)``
    A psycopg cursor with server-side binding on Django's connection, for
    ``bytea`` in binary both ways (PostgreSQL only).

Prepared statements (PostgreSQL): planning costs PostgreSQL more CPU than
running these point lookups and single-row writes (a 3-table join: ~0.2 ms to
plan, well under 0.1 ms to run). So every statement sent by ``execute`` in
batched mode is a session-level prepared statement (``PREPARE wc_run_<hash>
AS …``), created on a connection the first time it is needed (its own round
trip, once per connection) and then sent as ``EXECUTE wc_run_<hash>(…)``.
Prepared statements survive rollbacks. Should one disappear behind our back
(``DISCARD ALL`` by a pooler, a manual ``DEALLOCATE``), the EXECUTE fails
with SQLSTATE 26000 and the connection's bookkeeping is dropped. A
transaction-pooling pgbouncer would move the session under us between
transactions: run it in session mode, or set ``OPTIONS["server_side_binding"]``
(which turns batching, and so preparing, off).
"""
from __future__ import annotations

import hashlib
import re
import weakref
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable, Iterator, Sequence

from django.db import DEFAULT_DB_ALIAS, connections

__all__ = [
    "Statement",
    "batches_statements",
    "binary_cursor",
    "database",
    "db_values",
    "execute",
    "execute_text",
    "is_missing_prepared_statement",
    "query",
    "rollback_open_transaction",
    "run_script",
    "rowcount",
    "rows",
    "script_statements",
    "source_text",
    "table",
]

#: ``(sql, params, wants_rows)``: one statement of an ``execute`` call.
Statement = tuple[str, Sequence[Any], bool]


def database() -> Any:
    """Django's default connection itself (not the ``django.db.connection`` proxy)."""
    return connections[DEFAULT_DB_ALIAS]


def table(model: Any) -> str:
    """The table name of a Django model class (``_meta.db_table``), for fixed SQL text."""
    return model._meta.db_table


def batches_statements(db: Any) -> bool:
    """Whether several statements can travel in one query string (one round trip).

    True on PostgreSQL with Django's default client-side parameter binding
    (psycopg then uses the simple query protocol, which accepts
    ``stmt; stmt; …``); False on SQLite (in-process, nothing to save) and
    with ``OPTIONS["server_side_binding"]``.
    """
    return db.vendor == "postgresql" and db.settings_dict["OPTIONS"].get("server_side_binding") is not True


def db_values(db: Any, values: Iterable[Any]) -> list[Any]:
    """Column values as the database driver takes them (SQLite wants naive UTC text for datetimes)."""
    adapt = db.ops.adapt_datetimefield_value
    return [adapt(v) if isinstance(v, datetime) else v for v in values]


# --------------------------------------------------------------------------- prepared statements

#: psycopg connection -> names of the statements prepared on it.
_PREPARED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()
#: Each prepared statement keeps its parse tree and plans in the server session's memory, roughly
#: 1 KiB per parameter (a 64-message enqueue batch, ~900 parameters: ~1.1 MiB; docs/benchmarks.md
#: "Prepared queue scripts"). So only statements with at most PREPARED_MAX_PARAMS parameters are
#: prepared (the hot shapes: single-message enqueues and small outcome batches), and at most
#: PREPARED_PER_CONNECTION of them per connection; the rest travel as text (~13 MiB per backend at most).
PREPARED_MAX_PARAMS = 48
PREPARED_PER_CONNECTION = 128
_PREFIX = "wc_run_"
_PLACEHOLDER = re.compile(r"%s")
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE
#: First words of statements that cannot be prepared (PostgreSQL prepares only SELECT, INSERT, UPDATE,
#: DELETE, MERGE and VALUES, so also WITH): these are sent as they are.
_UTILITY = ("BEGIN", "COMMIT", "ROLLBACK", "SET ")


def _is_utility(sql: str) -> bool:
    return sql.startswith(_UTILITY)


@lru_cache(maxsize=None)
def _prepared_form(sql: str) -> tuple[str, str, int]:
    """``(name, PREPARE statement, parameter count)`` of ``sql`` (``%s`` placeholders)."""
    name = _PREFIX + hashlib.sha1(sql.encode()).hexdigest()[:20]
    count = 0

    def number(_match: re.Match) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    body = _PLACEHOLDER.sub(number, sql)
    _SOURCES[name] = sql
    return name, f"PREPARE {name} AS {body}", count


#: prepared name -> its statement text (``%s`` placeholders), for ``source_text``.
_SOURCES: dict[str, str] = {}
_EXECUTE = re.compile(r"EXECUTE (" + _PREFIX + r"[0-9a-f]{20})(\([^)]*\))?")


def source_text(wire: str) -> str:
    """``wire`` (a query string as sent) with every ``EXECUTE wc_run_…(…)`` replaced by its statement's text.

    For tests that recognise statements by their text; a name this process
    never prepared is left as it is.
    """
    return _EXECUTE.sub(lambda m: _SOURCES.get(m.group(1), m.group(0)), wire)


@lru_cache(maxsize=None)
def execute_text(sql: str) -> str:
    """What ``execute`` sends for ``sql`` once it is prepared: ``EXECUTE name(%s, …)``.

    Utility statements (``BEGIN``, ``COMMIT``, ``ROLLBACK``, ``SET …``) are
    sent as they are. Tests that inject faults by statement use this to
    recognise a statement on the wire.
    """
    if _is_utility(sql):
        return sql
    name, _, count = _prepared_form(sql)
    return f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"


@lru_cache(maxsize=256)
def script_statements(script: str) -> tuple[tuple[str, int], ...]:
    """The statements of a ``stmt; stmt; …`` string with their ``%s`` counts: ``((sql, n), …)``.

    Splits at ``;`` outside single-quoted literals (fixed SQL text has no
    other quoting that may hold one: identifiers are double-quoted names).
    """
    parts: list[str] = []
    start = 0
    quoted = False
    for i, ch in enumerate(script):
        if ch == "'":
            quoted = not quoted
        elif ch == ";" and not quoted:
            parts.append(script[start:i])
            start = i + 1
    parts.append(script[start:])
    statements = tuple(p.strip() for p in parts if p.strip())
    return tuple((sql, sql.count("%s")) for sql in statements)


def is_missing_prepared_statement(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is PostgreSQL's "prepared statement … does not exist" (26000)."""
    for err in (exc, exc.__cause__):
        if getattr(err, "sqlstate", None) == "26000":
            return True
    return False


def _prepare_missing(db: Any, cur: Any, sqls: Iterable[str]) -> set[str]:
    """Prepare on ``db``'s connection every statement of ``sqls`` it does not have yet (up to the cap).

    Returns the names prepared on the connection; a statement whose name is
    not among them is sent as plain text (too many parameters, or the cap
    was reached).
    """
    pg = db.connection
    names = _PREPARED.get(pg)
    if names is None:
        names = _PREPARED[pg] = set()
    missing = {}
    for sql in sqls:
        if not _is_utility(sql):
            name, prepare, count = _prepared_form(sql)
            if (name not in names and count <= PREPARED_MAX_PARAMS
                    and len(names) + len(missing) < PREPARED_PER_CONNECTION):
                missing[name] = prepare
    if not missing:
        return names
    try:
        cur.execute("; ".join(missing.values()))
    except Exception:
        # Some may exist already (bookkeeping lost): learn what this session has, retry.
        if db.in_atomic_block or pg.info.transaction_status != _IDLE:
            raise
        cur.execute(f"SELECT name FROM pg_prepared_statements WHERE starts_with(name, '{_PREFIX}')")
        names.clear()
        names.update(row[0] for row in cur.fetchall())
        todo = [prepare for name, prepare in missing.items() if name not in names]
        if todo:
            cur.execute("; ".join(todo))
    names.update(missing)
    return names


def _wire_text(sql: str, names: set[str]) -> str:
    """``sql`` as sent: its ``EXECUTE`` when prepared on the connection, else the text itself."""
    if _is_utility(sql) or _prepared_form(sql)[0] not in names:
        return sql
    return execute_text(sql)


# --------------------------------------------------------------------------- execution


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


def _run(db: Any, statements: Sequence[Statement], batched: bool, prepared: int | None = None) -> list[list[tuple]]:
    """``wants_rows`` None: the statement's rows when it returns any (``run_script``'s rule).

    ``prepared``: only the first this many statements may be prepared, the rest go as text.
    """
    fetched: list[list[tuple]] = []
    with _cursor(db, batched) as cur:
        if batched:
            head = statements if prepared is None else statements[:prepared]
            names = _prepare_missing(db, cur, (sql for sql, _, _ in head))
            text = "; ".join(
                [_wire_text(sql, names) for sql, _, _ in head] + [sql for sql, _, _ in statements[len(head):]]
            )
            try:
                cur.execute(text, [p for _, ps, _ in statements for p in ps])
            except Exception as exc:
                if is_missing_prepared_statement(exc):
                    _PREPARED.pop(db.connection, None)
                raise
            for i, (_, _, wants_rows) in enumerate(statements):
                if i:
                    cur.nextset()
                if wants_rows or (wants_rows is None and cur.description is not None):
                    fetched.append(cur.fetchall())
        else:
            for sql, params, wants_rows in statements:
                cur.execute(sql, params or None)
                if wants_rows:
                    fetched.append(cur.fetchall())
    return fetched


def execute(db: Any, statements: Sequence[Statement]) -> list[list[tuple]]:
    """Run ``(sql, params, wants_rows)`` in order; the rows of each statement that wants them.

    One round trip of prepared statements on PostgreSQL (``batches_statements``),
    one statement at a time elsewhere. On an error the statements after the
    failing one do not run. A vanished prepared statement (26000) is retried
    once when the call cannot have changed anything: outside ``atomic()`` and
    with no transaction left open (a list that begins with ``BEGIN`` is
    therefore never retried here: its caller rolls back and decides).
    """
    batched = batches_statements(db)
    try:
        return _run(db, statements, batched)
    except Exception as exc:
        if not (batched and is_missing_prepared_statement(exc)) or db.in_atomic_block:
            raise
        pg = db.connection
        if pg is None or pg.closed or pg.info.transaction_status != _IDLE:
            raise
        return _run(db, statements, batched)


def query(db: Any, sql: str, params: Sequence[Any]) -> list[tuple]:
    """The rows of one statement (see ``execute``)."""
    return execute(db, [(sql, params, True)])[0]


def rows(db: Any, sql: str, params: Sequence[Any]) -> list[tuple]:
    """Run one statement on Django's cursor (not prepared); its rows, ``[]`` when it returns none."""
    with db.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def rowcount(db: Any, sql: str, params: Sequence[Any]) -> int:
    """Run one write statement on Django's cursor (not prepared); the number of rows it changed."""
    with db.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def run_script(db: Any, script: str, params: Sequence[Any]) -> list[list[tuple]]:
    """Run a ``BEGIN; …; COMMIT[; …]`` string in one round trip; the rows of each statement that returns rows.

    ``params`` are the ``%s`` values of all its statements, in order. On
    PostgreSQL with batching (``batches_statements``) the statements inside
    the script's transaction travel as prepared ``EXECUTE``s (``execute``;
    utility statements and those after ``COMMIT`` as text): the queue's
    scripts cost PostgreSQL more to parse and plan than to run
    (docs/benchmarks.md "Prepared queue scripts"). Should a prepared statement
    have vanished (26000, e.g. a pooler's ``DISCARD ALL``), nothing of the
    script was committed, and it is sent once more after preparing again.
    On any other error the server's transaction is rolled back (nothing of
    it is committed, ``rollback_open_transaction``) and the error propagates.

    Raises ``ValueError`` when ``params`` hold more values than the script's
    placeholders.
    """
    db.ensure_connection()
    try:
        if batches_statements(db):
            pending = list(params)
            statements: list[Statement] = []
            for sql, n in script_statements(script):
                statements.append((sql, pending[:n], None))  # type: ignore[arg-type]
                del pending[:n]
            if pending:
                raise ValueError(f"run_script: {len(pending)} parameter(s) more than the script's placeholders")
            # only what runs inside the script's own transaction is prepared (none without a leading BEGIN)
            opens = bool(statements) and statements[0][0] == "BEGIN"
            commit = 0
            if opens:
                commit = next((i for i, (sql, _, _) in enumerate(statements) if sql == "COMMIT"), len(statements))
            try:
                return _run(db, statements, True, prepared=commit)
            except Exception as exc:
                if not is_missing_prepared_statement(exc) or db.in_atomic_block:
                    raise
                rollback_open_transaction(db)  # the failed EXECUTE was inside BEGIN … COMMIT: nothing committed
                return _run(db, statements, True, prepared=commit)
        with db.cursor() as cur:
            cur.execute(script, params)
            results = []
            while True:
                if cur.description is not None:
                    results.append(cur.fetchall())
                if not cur.nextset():
                    break
            return results
    except BaseException:
        rollback_open_transaction(db)
        raise


def rollback_open_transaction(db: Any) -> None:
    """Roll back a transaction a ``BEGIN`` sent through ``execute`` left open (no-op when none).

    When the state of the connection cannot be known (the rollback itself
    fails), the connection is closed; Django opens a fresh one next time.
    """
    pg = db.connection
    if pg is None or pg.closed:
        return
    try:
        with db.wrap_database_errors:
            pg.rollback()  # no-op when no transaction is open
    except Exception:  # noqa: BLE001 - the state of the connection is unknown: drop it
        db.close()


@contextmanager
def binary_cursor(db: Any) -> Iterator[Any]:
    """A psycopg cursor with server-side parameters on Django's own connection (PostgreSQL).

    Bytes then travel in binary both ways instead of as hex literals (a
    16 MiB chunk writes ~2x and reads ~3x faster). It shares Django's
    connection, transaction and autocommit state; errors are translated to
    ``django.db`` exceptions. Queries sent here do not appear in Django's
    query log.
    """
    import psycopg

    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors, psycopg.Cursor(db.connection) as cur:
        yield cur
