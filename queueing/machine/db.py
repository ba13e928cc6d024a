"""How the queue state machine runs its SQL: through the project's one executor, ``worldcell.sql``.

The general path's statements go through its plain-cursor calls (``rows``,
``rowcount``), so transactions, on-commit hooks and
``connection.execute_wrapper`` (the fault-injection tests) see each one with
its text (docs/decisions.md "Queue rules written once"). The one-trip
scripts (``run_script``, PostgreSQL) travel as prepared statements: their
parsing and planning cost PostgreSQL more than running them
(docs/benchmarks.md "Prepared queue scripts"); a fault test recognises one
by ``worldcell.sql.execute_text``.
"""
from __future__ import annotations

from typing import Any, Sequence

from django.db import connection

from worldcell import sql as executor

from . import sql

__all__ = ["commit_without_flush", "lock_clause", "one_trip_enabled", "rowcount", "rows", "run_script"]


def rows(statement: str, params: Sequence[Any]) -> list[tuple]:
    """Run one fixed statement on the default connection; its rows (empty for none)."""
    return executor.rows(executor.database(), statement, params)


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
        executor.rows(executor.database(), sql.NO_FLUSH, ())


def run_script(script: str, params: Sequence[Any]) -> list[list[tuple]]:
    """Run a ``BEGIN; …; COMMIT`` string in one round trip (prepared statements); the rows of each that returns rows.

    On any error the server's transaction is rolled back (nothing of it is
    committed) and the error propagates.
    """
    return executor.run_script(executor.database(), script, params)
