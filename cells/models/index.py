"""Models of the index cell: one ordered key/value table (docs/protocol.md §4.3, §6).

The index is the only generic key/value store of worldcell (docs/architecture.md, §13):
the client writes arbitrary keys into it (``run:…``, ``runall:…``,
``correlation:…``) and the hook-token methods keep ``hook:``, ``hookid:`` and
``hookclaim:`` entries there. One row = one key of one cell.

Keys order by Unicode code point (= UTF-8 bytes, §1.3 and §12 A3): on
PostgreSQL the ``cell`` and ``key`` columns use ``COLLATE "C"`` so the unique
``(tenant, cell, key)`` btree serves ``list`` as an index range scan; SQLite's default
BINARY collation already compares UTF-8 bytes.

The hot single-key operations are one SQL statement each (see
``IndexEntryManager``): ``put`` is an upsert, ``delete`` a plain DELETE, so
writes of unrelated keys only ever meet on row locks of their own keys.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

from django.db import connection, models

from worldcell import sql
from worldcell.tenancy import tenant_key
from worldcell.fields import BytewiseTextField  # COLLATE "C" on PostgreSQL, chosen when the migration is applied

__all__ = ["IndexEntry", "IndexEntryManager", "lock_hook_token"]


class IndexEntryManager(models.Manager):
    """Single-statement SQL for the hot index operations.

    Values are passed and returned as codec-encoded text (``worldcell.codec``);
    the service decodes/encodes. Each method runs in the caller's transaction
    if there is one, else as one autocommit statement.
    """

    def value_of(self, cell: str, key: str, *, tenant: str) -> str | None:
        """The stored text of ``key`` in ``tenant``'s ``cell``, or None when absent."""
        found = sql.rows(sql.database(), _VALUE_OF, [tenant, cell, key])
        return found[0][0] if found else None

    def values_of(self, cell: str, keys: Iterable[str], *, tenant: str, for_update: bool = False) -> dict[str, str]:
        """``{key: text}`` of those ``keys`` that exist in ``tenant``'s ``cell`` (one query).

        ``for_update`` locks the found rows until the transaction ends
        (PostgreSQL; SQLite transactions are already exclusive).
        """
        keys = list(keys)
        marks = ", ".join(["%s"] * len(keys))
        lock = " FOR UPDATE" if for_update and connection.features.has_select_for_update else ""
        return dict(sql.rows(
            sql.database(), f'SELECT key, value FROM "{_TABLE}" WHERE tenant = %s AND cell = %s AND key IN ({marks}){lock}',
            [tenant, cell, *keys],
        ))

    def put_values(self, cell: str, items: Iterable[tuple[str, str]], *, tenant: str) -> None:
        """Insert or overwrite each ``(key, text)`` of ``tenant``'s ``cell`` in one upsert statement."""
        items = list(items)
        rows = ", ".join(["(%s, %s, %s, %s)"] * len(items))
        params: list[str] = []
        for key, text in items:
            params += [tenant, cell, key, text]
        sql.rowcount(
            sql.database(),
            f'INSERT INTO "{_TABLE}" (tenant, cell, key, value) VALUES {rows} '
            "ON CONFLICT (tenant, cell, key) DO UPDATE SET value = excluded.value",
            params,
        )

    def delete_keys(self, cell: str, keys: Iterable[str], *, tenant: str) -> int:
        """Delete those ``keys`` of ``tenant``'s ``cell`` that exist; returns how many rows went."""
        keys = list(keys)
        if not keys:
            return 0
        marks = ", ".join(["%s"] * len(keys))
        return sql.rowcount(sql.database(), f'DELETE FROM "{_TABLE}" WHERE tenant = %s AND cell = %s AND key IN ({marks})',
                            [tenant, cell, *keys])

    def page_of_keys(
        self,
        cell: str,
        *,
        tenant: str,
        lower: str,
        upper: str | None,
        cursor: str | None,
        reverse: bool,
        fetch: int,
    ) -> list[str]:
        """Up to ``fetch`` keys of ``tenant``'s ``cell`` in ``[lower, upper)`` beyond ``cursor``.

        Ascending keys are strictly greater than ``cursor``; with ``reverse``
        they are strictly less and come in descending order. ``upper`` None
        means unbounded. One index range scan on ``(tenant, cell, key)``.
        """
        where = ["tenant = %s", "cell = %s", "key >= %s"]
        params: list[object] = [tenant, cell, lower]
        if upper is not None:
            where.append("key < %s")
            params.append(upper)
        if cursor is not None:
            where.append("key < %s" if reverse else "key > %s")
            params.append(cursor)
        order = "DESC" if reverse else "ASC"
        params.append(fetch)
        text = f'SELECT key FROM "{_TABLE}" WHERE {" AND ".join(where)} ORDER BY key {order} LIMIT %s'
        return [row[0] for row in sql.rows(sql.database(), text, params)]


class IndexEntry(models.Model):
    """One key of one index cell (docs/protocol.md §6.1).

    Fields:
        tenant: the owning tenant's slug (``worldcell.tenancy``); the first column of the unique key.
        cell: the cell name (the client always uses ``index``); bytewise collation.
        key: the key, e.g. ``run:<workflow>:<ms13>:<runId>``; unique per cell,
            ordered bytewise (``COLLATE "C"`` on PostgreSQL).
        value: the stored value as codec-encoded JSON text (any JSON value:
            the client's JSON strings, ``hookclaim:`` objects, bytes, dates).
    """

    tenant = tenant_key()
    cell = BytewiseTextField()
    key = BytewiseTextField()
    value = models.TextField(help_text="codec-encoded JSON of the stored value")

    objects = IndexEntryManager()

    class Meta:
        db_table = "cells_indexentry"
        verbose_name = "index entry"
        verbose_name_plural = "index entries"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "cell", "key"], name="cells_indexentry_tenant_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.cell}/{self.key}"


_TABLE = sql.table(IndexEntry)
_VALUE_OF = f'SELECT value FROM "{_TABLE}" WHERE tenant = %s AND cell = %s AND key = %s'


def _hook_token_lock_id(tenant: str, cell: str, token: str) -> int:
    digest = hashlib.blake2b(
        f"worldcell:index-hook-token\x00{tenant}\x00{cell}\x00{token}".encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_hook_token(cell: str, token: str, *, tenant: str) -> None:
    """Serialize hook-token work on ``token`` of ``tenant``'s index cell ``cell`` until the transaction ends.

    PostgreSQL: ``pg_advisory_xact_lock`` on a 64-bit hash of (tenant, cell, token),
    so operations on *different* tokens never wait for each other (§6.3,
    docs/architecture.md rule 1) and no lock row has to be created or cleaned up. A hash
    collision can only make two tokens wait for each other, never break
    correctness. SQLite: a no-op — its IMMEDIATE transactions already hold
    the database write lock. Must be called inside ``transaction.atomic()``.
    """
    if connection.vendor != "postgresql":
        return
    sql.rows(sql.database(), "SELECT pg_advisory_xact_lock(%s)", [_hook_token_lock_id(tenant, cell, token)])
