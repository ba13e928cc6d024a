"""How the queue state machine runs its SQL: the one module that touches a cursor.

Statements go through Django's own cursor, so transactions, on-commit hooks
and ``connection.execute_wrapper`` (the fault-injection tests) see every one
of them with its text; writes and the clean-up after a failed one-trip
script use the project executor ``worldcell.sql`` (``rowcount``,
``rollback_open_transaction``). Its ``execute`` sends prepared ``EXECUTE``
statements instead of the text; moving the queue's reads and scripts onto it
is a change of this module alone (docs/decisions.md "Queue rules written
once").
"""
from __future__ import annotations

from typing import Any, Sequence

from django.db import connection

from worldcell import sql as executor

from . import sql

__all__ = ["commit_without_flush", "lock_clause", "one_trip_enabled", "rowcount", "rows", "run_script"]


def rows(statement: str, params: Sequence[Any]) -> list[tuple]:
    """Run one fixed statement on the default connection; its rows (empty for none)."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description is not None else []


def rowcount(statement: str, params: Sequence[Any]) -> int:
    """Run one fixed write statement; the number of rows it changed."""
    return executor.rowcount(executor.database(), statement, params)


def lock_clause(skip_locked: bool) -> str:
    """The row-lock suffix of a cell read: ``FOR UPDATE [SKIP LOCKED]``; none on SQLite (the IMMEDIATE transaction locks)."""
    if not connection.features.has_select_for_update:
        return ""
    return sql.LOCK_OR_SKIP if skip_locked else sql.LOCK


def one_trip_enabled() -> bool:
    """Whether a transition may run as one ``BEGIN; …; COMMIT`` string (PostgreSQL, outside ``atomic``)."""
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def commit_without_flush() -> None:
    """Let the current transaction commit without waiting for its WAL flush (PostgreSQL; see ``apply_outcomes``)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql.NO_FLUSH)


def run_script(script: str, params: Sequence[Any]) -> list[list[tuple]]:
    """Run a ``BEGIN; …; COMMIT`` string in one round trip; the rows of each statement that returns rows.

    On any error the server's transaction is rolled back (nothing of it is
    committed) and the error propagates.
    """
    connection.ensure_connection()
    try:
        with connection.cursor() as cursor:
            cursor.execute(script, params)
            results = []
            while True:
                if cursor.description is not None:
                    results.append(cursor.fetchall())
                if not cursor.nextset():
                    break
            return results
    except BaseException:
        executor.rollback_open_transaction(executor.database())
        raise
