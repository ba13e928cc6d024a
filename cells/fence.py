"""The retention fence's guards: what an expired run answers (docs/lifecycle.md §2–§3).

A run is behind its fence once ``RunCellState.expired`` is set (in the same
transaction that writes its ``RunTombstone``, ``cells.lifecycle.expiry.expire_runs``).
The cell services call these at single, delimited hook points:

* ``RunExpired`` — HTTP 410 ``RunExpiredError`` (reads of an expired run,
  late index puts, hook finalisation, stream registration);
* ``expired_outcome`` — the ``applyEvent`` answer ``RUN_EXPIRED``;
* ``enqueue_refusal`` / ``refuse_enqueue`` — the ``enqueue`` answer ``RUN_EXPIRED`` (the queue's
  enqueue transition checks the tombstone in its own transaction, ``EnqueueRequest.fence``);
* ``put_index_unless_expired`` — a run-scoped index put in one statement
  that does nothing for an expired run.

This module depends on the models only, so every cell service may import it.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

from worldcell import clock, codec
from worldcell import sql as wsql
from worldcell.errors import CellError

from .models import IndexEntry, RunCellState, RunTombstone

__all__ = [
    "RunExpired",
    "expired_at_of",
    "expired_message",
    "expired_outcome",
    "is_expired",
    "put_index_unless_expired",
    "raise_if_expired",
    "enqueue_refusal",
    "refuse_enqueue",
    "run_of_index_key",
]



def expired_message(run_id: str, expired_at: datetime) -> str:
    """The RunExpiredError message (as world-celld 0.4 words it)."""
    return f'Workflow run "{run_id}" expired at {codec.format_iso(expired_at)}'


class RunExpired(CellError):
    """A call on an expired run: HTTP 410 ``{"error":{"name":"RunExpiredError","message":…,"status":410}}``.

    The v0.1 client rebuilds it as an error named ``RunExpiredError`` with
    ``status`` 410, which its queue handler treats as permanent (the message
    is dropped, not retried): docs/lifecycle.md "What an expired run answers".
    """

    http_status = 410

    def __init__(self, run_id: str, expired_at: datetime):
        super().__init__(expired_message(run_id, expired_at), name="RunExpiredError", status=410)
        self.run_id = run_id


def _rows(statement: str, params: Iterable[Any]) -> list[tuple]:
    """The rows of one fixed statement (``worldcell.sql.query``: prepared on PostgreSQL)."""
    return wsql.query(wsql.database(), statement, list(params))


_T = wsql.table(RunTombstone)
_CELL = wsql.table(RunCellState)
_IDX = wsql.table(IndexEntry)
_EXPIRED_AT = f'SELECT "expired_at" FROM "{_T}" WHERE "run_id" = %s'
_IS_EXPIRED = f'SELECT 1 FROM "{_CELL}" WHERE "name" = %s AND "expired"'


def expired_at_of(run_id: str) -> datetime | None:
    """When run ``run_id`` expired (its tombstone's ``expired_at``), or None if it has no tombstone."""
    rows = _rows(_EXPIRED_AT, [run_id])
    return codec.to_utc_ms(rows[0][0]) if rows else None


def is_expired(run_id: str) -> bool:
    """Whether run ``run_id`` is behind its retention fence (one indexed lookup)."""
    return bool(_rows(_IS_EXPIRED, [run_id]))


def raise_if_expired(run_id: str) -> None:
    """Raise ``RunExpired`` (410) when run ``run_id`` has a tombstone; else return."""
    expired_at = expired_at_of(run_id)
    if expired_at is not None:
        raise RunExpired(run_id, expired_at)


def expired_outcome(run_id: str) -> dict[str, Any]:
    """The ``applyEvent`` answer for an expired run: ``{"ok":false,"code":"RUN_EXPIRED",…}`` (§4.5)."""
    expired_at = expired_at_of(run_id) or clock.now()
    return {"ok": False, "code": "RUN_EXPIRED", "message": expired_message(run_id, expired_at)}


#: Index key families that name their run in the last ``:`` segment (client conventions, §4.3).
_RUN_SCOPED_PREFIXES = ("run:", "runall:", "correlation:")


def run_of_index_key(key: str) -> str | None:
    """The run a listing/correlation key belongs to (``run:<wf>:<ms13>:<runId>``,
    ``runall:<ms13>:<runId>``, ``correlation:<id>:<ms13>:<eventId>:<runId>``), or None."""
    if not key.startswith(_RUN_SCOPED_PREFIXES):
        return None
    run_id = key.rsplit(":", 1)[-1]
    return run_id or None


#: Fixed text, so ``worldcell.sql.query`` runs it as a prepared statement (PostgreSQL plans it
#: once per connection); ``RETURNING`` tells a write from a refusal without a rowcount.
_PUT_UNLESS_EXPIRED = (
    f'INSERT INTO "{_IDX}" ("tenant", "cell", "key", "value") '
    'SELECT CAST(%s AS text), CAST(%s AS text), CAST(%s AS text), CAST(%s AS text) '
    f'WHERE NOT EXISTS (SELECT 1 FROM "{_CELL}" WHERE "name" = %s AND "expired") '
    'ON CONFLICT ("tenant", "cell", "key") DO UPDATE SET "value" = excluded."value" RETURNING 1'
)


def put_index_unless_expired(cell: str, key: str, text: str, run_id: str, *, tenant: str) -> None:
    """``index.put`` of a run-scoped key: one upsert that does nothing for an expired run.

    Raises ``RunExpired`` (410) when the run is expired, so a late index write
    (the client re-puts listing keys after each applyEvent) can never bring an
    expired run back into a listing.
    """
    if not wsql.query(wsql.database(), _PUT_UNLESS_EXPIRED, [tenant, cell, key, text, run_id]):
        raise RunExpired(run_id, expired_at_of(run_id) or clock.now())


def enqueue_refusal(run_id: str, expired_at: datetime) -> dict[str, Any]:
    """The ``enqueue`` answer for a message of run ``run_id``, expired at ``expired_at``.

    ``{"ok":false,"code":"RUN_EXPIRED",…}``. The queue's enqueue transition
    checks the tombstone itself, inside its transaction (``queueing.machine``,
    ``EnqueueRequest.fence``), and answers this.
    """
    return {"ok": False, "code": "RUN_EXPIRED", "message": expired_message(run_id, expired_at)}


def refuse_enqueue(run_id: str | None) -> dict[str, Any] | None:
    """The ``enqueue`` answer for a message of an expired run (``enqueue_refusal``), or None."""
    if run_id is None:
        return None
    expired_at = expired_at_of(run_id)
    if expired_at is None:
        return None
    return enqueue_refusal(run_id, expired_at)
