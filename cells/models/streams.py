"""Models of the streams cell: streams, their chunks, and per-run stream registries (docs/protocol.md §8).

A streams cell plays two roles chosen by which methods are called (§8.1):

* chunk role (cell ``stream:<name>``): one ``Stream`` row (chunks written =
  next index, closed flag) is the cell's lock target; each chunk is a
  ``StreamChunk`` row keyed by ``(stream, index)``;
* registry role (cell ``run-streams:<runId>``): one ``StreamRegistration``
  row per registered stream name.

Chunk payloads: bytes (all the reference client ever sends) go into the
binary ``data`` column as they are — no base64 inflation, previewable in the
admin; any other value (§12 A11: a legacy ``{"__uint8array":…}`` object, a
string, null) goes into ``value`` as codec-encoded text and is echoed
verbatim. Exactly one of the two columns is non-NULL.

``StreamManager`` holds the hot-path SQL: ``writeChunk`` is a single
statement on PostgreSQL (an upsert that locks the stream row and allocates
the index, chained to the chunk INSERT) and two statements inside one
IMMEDIATE transaction on SQLite.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, models, transaction

from worldcell import sql
from worldcell.fields import BytewiseTextField
from worldcell.tenancy import tenant_key

__all__ = ["Stream", "StreamChunk", "StreamManager", "StreamRegistration", "StreamRegistrationManager"]


class StreamManager(models.Manager):
    """SQL of the chunk role; every method is one short statement or transaction."""

    def append_chunk(self, name: str, data: bytes | None, value: str | None, now: datetime, *, tenant: str) -> int | None:
        """Append one chunk to ``tenant``'s stream ``name`` (created if missing) and return its index.

        Locks the stream row, allocates ``index = count`` and bumps ``count``
        in one upsert, then inserts the chunk — all in one transaction, so
        concurrent writers get dense indexes 0..N-1 (§8.2). Pass either
        ``data`` (bytes) or ``value`` (codec text). Returns None, writing
        nothing, when the stream is closed.
        """
        if connection.vendor == "postgresql":
            with sql.binary_cursor(sql.database()) as cur:
                cur.execute(_APPEND_PG, [tenant, name, False, now, now, data, value])
                row = cur.fetchone()
            return None if row is None else row[0]
        stamp = connection.ops.adapt_datetimefield_value(now)
        db = sql.database()
        with transaction.atomic():
            allocated = sql.rows(db, _UPSERT_FOR_APPEND, [tenant, name, False, stamp, stamp])
            if not allocated:
                return None
            stream_id, index = allocated[0]
            sql.rowcount(db, _INSERT_CHUNK, [stream_id, index, data, value])
            return index

    def close(self, name: str, now: datetime, *, tenant: str) -> None:
        """Mark ``tenant``'s stream ``name`` closed, creating it (empty) if missing; idempotent (§8.2)."""
        stamp = connection.ops.adapt_datetimefield_value(now)
        sql.rowcount(sql.database(), _CLOSE, [tenant, name, True, stamp, stamp, True])

    def meta(self, name: str, *, tenant: str) -> tuple[int, int, bool] | None:
        """``(id, count, closed)`` of ``tenant``'s stream ``name``, or None when it was never written."""
        found = sql.rows(sql.database(), _META, [tenant, name])
        return (found[0][0], found[0][1], bool(found[0][2])) if found else None

    @staticmethod
    def chunk_page_query(stream_id: int, start: int, end: int, limit: int | None) -> tuple[str, list[Any]]:
        """The ``(sql, params)`` that ``chunk_page`` runs (exposed so its plan can be checked).

        Indexes are dense, so the page is exactly the index range
        ``[start, min(end, start + limit))``: the range itself is bounded by
        ``limit``, whatever plan the database picks (even with stale
        statistics a bitmap scan plus sort touches at most ``limit`` rows).
        """
        if limit is None:
            return _CHUNK_PAGE, [stream_id, start, end]
        return _CHUNK_PAGE + " LIMIT %s", [stream_id, start, min(end, start + limit), limit]

    def chunk_page(self, stream_id: int, start: int, end: int, limit: int | None) -> list[tuple[Any, str | None]]:
        """``(data, value)`` of chunks ``start <= index < end`` in index order, at most ``limit``.

        One range scan on the ``(stream, index)`` unique index over at most
        ``limit`` index values: cost is proportional to ``limit``, not to the
        stream length. ``limit`` None
        reads every chunk of the range. ``end`` is the count read with the
        stream row, so a page never runs past the ``tailIndex`` it reports.
        ``data`` is bytes (or None for a non-bytes chunk).
        """
        text, params = self.chunk_page_query(stream_id, start, end, limit)
        if connection.vendor == "postgresql":
            with sql.binary_cursor(sql.database()) as cur:
                cur.execute(text, params, binary=True)
                return cur.fetchall()
        return sql.rows(sql.database(), text, params)


class StreamRegistrationManager(models.Manager):
    """SQL of the registry role (§8.2 ``registerStream`` / ``listStreams``)."""

    def register(self, cell: str, name: str, now: datetime, *, tenant: str) -> None:
        """Record ``name`` in ``tenant``'s registry cell ``cell``; idempotent (one INSERT … ON CONFLICT DO NOTHING)."""
        sql.rowcount(sql.database(), _REGISTER, [tenant, cell, name, connection.ops.adapt_datetimefield_value(now)])

    def names(self, cell: str, *, tenant: str) -> list[str]:
        """Every name registered in ``tenant``'s ``cell``, ascending bytewise (index scan on ``(tenant, cell, name)``)."""
        return [row[0] for row in sql.rows(sql.database(), _NAMES, [tenant, cell])]


class Stream(models.Model):
    """One stream cell in its chunk role (``stream:<name>``), the lock target of its writes.

    Fields:
        tenant: the owning tenant's slug (``worldcell.tenancy``); first column of the unique key.
        name: the cell name, e.g. ``stream:strm_01J…``; unique per tenant, bytewise collation.
        count: chunks written so far, i.e. the next chunk index (``tailIndex`` = count − 1).
        closed: true once ``closeStream`` ran; further writes fail (§8.2).
        created_at / updated_at: first and latest write or close (UTC).
    """

    tenant = tenant_key()
    name = BytewiseTextField()
    count = models.BigIntegerField(default=0, help_text="chunks written = next chunk index")
    closed = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = StreamManager()

    class Meta:
        db_table = "cells_stream"
        verbose_name = "stream"
        # A constraint rather than unique=True: no redundant text_pattern_ops
        # index on PostgreSQL (the C collation already serves prefix scans).
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="cells_stream_tenant_name_uniq")]

    def __str__(self) -> str:
        return self.name


class StreamChunk(models.Model):
    """One chunk of a stream, at its 0-based ``index`` (§8.1).

    Fields:
        stream: the owning ``Stream``.
        index: 0-based position, dense per stream; unique with ``stream``.
        data: the chunk bytes (NULL when the chunk is not bytes).
        value: codec-encoded JSON of a non-bytes chunk (§12 A11), else NULL.
    """

    stream = models.ForeignKey(Stream, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    index = models.BigIntegerField()
    data = models.BinaryField(null=True, blank=True)
    value = models.TextField(null=True, blank=True, help_text="codec-encoded JSON of a non-bytes chunk")

    class Meta:
        db_table = "cells_streamchunk"
        verbose_name = "stream chunk"
        constraints = [
            models.UniqueConstraint(fields=["stream", "index"], name="cells_streamchunk_stream_index_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.stream_id}#{self.index}"


class StreamRegistration(models.Model):
    """A stream name registered in a registry cell (``run-streams:<runId>``, §8.1).

    Fields:
        tenant: the owning tenant's slug (``worldcell.tenancy``); first column of the unique key.
        cell: the registry cell name; bytewise collation.
        name: the registered stream name (without the ``stream:`` prefix);
            unique per cell, listed in bytewise order.
        created_at: when it was first registered (UTC).
    """

    tenant = tenant_key()
    cell = BytewiseTextField()
    name = BytewiseTextField()
    created_at = models.DateTimeField()

    objects = StreamRegistrationManager()

    class Meta:
        db_table = "cells_streamregistration"
        verbose_name = "stream registration"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "cell", "name"], name="cells_streamregistration_tenant_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.cell}/{self.name}"


# =========================================================================== SQL of the streams cell
#
# Fixed text (``worldcell.sql``), table names from the models; double-quoted
# identifiers are valid on both PostgreSQL and SQLite.

_STREAM, _CHUNK, _REGISTRATION = sql.table(Stream), sql.table(StreamChunk), sql.table(StreamRegistration)
_UPSERT_FOR_APPEND = (
    f'INSERT INTO "{_STREAM}" AS s (tenant, name, "count", closed, created_at, updated_at) '
    "VALUES (%s, %s, 1, %s, %s, %s) "
    'ON CONFLICT (tenant, name) DO UPDATE SET "count" = s."count" + 1, updated_at = excluded.updated_at '
    "WHERE NOT s.closed "
    'RETURNING id, "count" - 1'
)
# PostgreSQL: allocation and chunk insert chained by a CTE — one statement,
# one round trip, atomic on its own. No row comes back when the stream is closed.
_APPEND_PG = (
    f"WITH alloc (stream_id, idx) AS ({_UPSERT_FOR_APPEND}) "
    f'INSERT INTO "{_CHUNK}" (stream_id, "index", data, value) '
    'SELECT stream_id, idx, %s::bytea, %s::text FROM alloc RETURNING "index"'
)
_INSERT_CHUNK = f'INSERT INTO "{_CHUNK}" (stream_id, "index", data, value) VALUES (%s, %s, %s, %s)'
_CLOSE = (
    f'INSERT INTO "{_STREAM}" AS s (tenant, name, "count", closed, created_at, updated_at) '
    "VALUES (%s, %s, 0, %s, %s, %s) "
    "ON CONFLICT (tenant, name) DO UPDATE SET closed = %s, updated_at = excluded.updated_at"
)
_META = f'SELECT id, "count", closed FROM "{_STREAM}" WHERE tenant = %s AND name = %s'
_CHUNK_PAGE = (
    f'SELECT data, value FROM "{_CHUNK}" '
    'WHERE stream_id = %s AND "index" >= %s AND "index" < %s ORDER BY "index"'
)
_REGISTER = (
    f'INSERT INTO "{_REGISTRATION}" (tenant, cell, name, created_at) VALUES (%s, %s, %s, %s) '
    "ON CONFLICT (tenant, cell, name) DO NOTHING"
)
_NAMES = f'SELECT name FROM "{_REGISTRATION}" WHERE tenant = %s AND cell = %s ORDER BY name'
