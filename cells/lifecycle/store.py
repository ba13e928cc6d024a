"""What every step of retention reads and writes: statements, the client's index keys of a run, tombstone tallies.

* ``_rows`` / ``_rowcount`` — one statement through ``worldcell.sql``
  (Django's cursor, not prepared); ``_marks`` the placeholders of a list,
  ``_db_time`` a datetime as the database's parameter.
* ``listing_keys`` / ``correlation_key`` — the keys the reference client
  writes to the index cell (``INDEX_CELL``) for a run and for one event;
  ``delete_index_keys`` / ``delete_index_keys_by_run`` delete them.
* ``_add_tallies`` — adds what a transaction deleted to the tombstones'
  ``deleted`` counts and moves them to their next phase.

Expiry (``cells.lifecycle.expiry``), the cleanup phases
(``cells.lifecycle.cleanup``) and the sweep (``cells.lifecycle.sweeper``)
all go through these.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Iterable
from urllib.parse import quote

from django.db import connection

from worldcell import codec
from worldcell import sql as wsql
from worldcell.tenancy import DEFAULT_TENANT

from ..models import IndexEntry, RunCellState, RunTombstone

__all__ = ["INDEX_CELL", "correlation_key", "listing_keys"]

#: The index cell the reference client writes its listing/correlation/hook keys to.
INDEX_CELL = "index"
# The lifecycle engine works on the default tenant's runs: run cells and tombstones are not
# keyed by tenant yet (docs/tenants.md "What is in place"); the index keys it deletes are
# that tenant's.


def _rows(statement: str, params: Iterable[Any]) -> list[tuple]:
    """The rows of one statement (``worldcell.sql.rows``: Django's cursor, not prepared)."""
    return wsql.rows(wsql.database(), statement, list(params))


def _rowcount(statement: str, params: Iterable[Any]) -> int:
    return wsql.rowcount(wsql.database(), statement, list(params))


_T = wsql.table(RunTombstone)
_CELL = wsql.table(RunCellState)
_IDX = wsql.table(IndexEntry)


def _ms13(value: datetime) -> str:
    return str(max(0, codec.epoch_ms(value))).zfill(13)


def listing_keys(run_id: str, workflow_name: str, created_at: datetime) -> list[str]:
    """The client's two listing keys of a run (``run:<wf>:<ms13>:<id>``, ``runall:<ms13>:<id>``)."""
    ms = _ms13(created_at)
    return [f"run:{workflow_name}:{ms}:{run_id}", f"runall:{ms}:{run_id}"]


def correlation_key(correlation_id: str, created_at: datetime, event_id: str, run_id: str) -> str:
    """The client's correlation index key of one event (``encodeURIComponent`` of the id)."""
    encoded = quote(correlation_id, safe="-_.!~*'()")
    return f"correlation:{encoded}:{_ms13(created_at)}:{event_id}:{run_id}"


def _marks(values: list[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def _db_time(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def delete_index_keys(keys: list[str]) -> int:
    """Delete those of ``keys`` that exist in the index cell; how many went."""
    if not keys:
        return 0
    return _rowcount(f'DELETE FROM "{_IDX}" WHERE "tenant" = %s AND "cell" = %s AND "key" IN ({_marks(keys)})',
                     [DEFAULT_TENANT, INDEX_CELL, *keys])


def delete_index_keys_by_run(keys: list[str]) -> dict[str, int]:
    """Delete run-scoped ``keys`` (their run is the last ``:`` segment); ``{run id: keys deleted}``."""
    if not keys:
        return {}
    found = _rows(f'SELECT "key" FROM "{_IDX}" WHERE "tenant" = %s AND "cell" = %s AND "key" IN ({_marks(keys)})',
                  [DEFAULT_TENANT, INDEX_CELL, *keys])
    delete_index_keys([k for (k,) in found])
    out: dict[str, int] = {}
    for (key,) in found:
        run_id = key.rsplit(":", 1)[-1]
        out[run_id] = out.get(run_id, 0) + 1
    return out


_TOMB_LOCK = 'SELECT "id", "run_id", "deleted", "phase" FROM "{t}" WHERE "run_id" IN ({marks}) ORDER BY "id"{lock}'


def _add_tallies(tallies: dict[str, dict[str, int]], phases: dict[str, str]) -> None:
    """Add ``{run: {kind: n}}`` to the tombstones' ``deleted`` and set ``{run: phase}`` (caller's transaction).

    The tombstone rows are locked (PostgreSQL) and written with one
    parameterised UPDATE per row sent as one ``executemany``.
    """
    run_ids = sorted(set(tallies) | set(phases))
    if not run_ids:
        return
    postgres = connection.vendor == "postgresql"
    rows = _rows(_TOMB_LOCK.format(t=_T, marks=_marks(run_ids), lock=" FOR UPDATE" if postgres else ""), run_ids)
    updates = []
    for pk, run_id, deleted, phase in rows:
        deleted = dict(json.loads(deleted) if isinstance(deleted, (str, bytes)) else deleted or {})
        for kind, n in tallies.get(run_id, {}).items():
            if n:
                deleted[kind] = deleted.get(kind, 0) + n
        updates.append([json.dumps(deleted, sort_keys=True), phases.get(run_id, phase), pk])
    value = "CAST(%s AS jsonb)" if postgres else "%s"
    with connection.cursor() as cur:
        cur.executemany(f'UPDATE "{_T}" SET "deleted" = {value}, "phase" = %s WHERE "id" = %s', updates)
