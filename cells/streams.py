"""The streams cell service: ordered chunks of one stream, or one run's stream registry (docs/protocol.md §4.2, §8).

``StreamCell(name)`` serves the ``streams`` binding. Both roles work on any
cell name; the client uses ``stream:<streamName>`` for chunks and
``run-streams:<runId>`` for the registry (§8.1).

* ``writeChunk`` locks the ``Stream`` row and allocates the next index in
  the same statement that bumps its count, so concurrent writers get dense,
  monotonic indexes; on PostgreSQL the chunk insert rides in that statement
  too (one round trip).
* ``closeStream`` and ``registerStream`` are single idempotent upserts.
* Reads take no lock. ``getChunks`` reads the stream row *before* the
  chunks: a reader that sees ``done`` also sees every chunk written before
  the close.
"""
from __future__ import annotations

from typing import Any

from worldcell import clock, codec
from worldcell.errors import CellError, ValidationError
from worldcell.keys import require_storable
from worldcell.tenancy import DEFAULT_TENANT

from . import fence
from .models import Stream, StreamRegistration

__all__ = ["StreamCell"]

#: Largest cell name or registered stream name, in UTF-8 bytes (one btree entry).
NAME_MAX_BYTES = 1024
#: Positions beyond this are past any stream (keeps the bound inside BIGINT).
_INDEX_CAP = 2**62

_ABSENT: Any = object()
_EMPTY_INFO = {"tailIndex": -1, "done": False}


def _int_arg(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{field}: expected an integer")
    return value


class StreamCell:
    """One streams cell (docs/protocol.md §8).

    Args:
        name: the cell name, e.g. ``stream:a/b`` or ``run-streams:wrun_1``.

    Raises ValidationError when the name cannot be stored (U+0000, unpaired
    surrogate, longer than ``NAME_MAX_BYTES``).
    """

    def __init__(self, name: str, tenant: str = DEFAULT_TENANT):
        self.name = require_storable(name, "cell name", max_bytes=NAME_MAX_BYTES)
        self.tenant = tenant

    # ------------------------------------------------------------ chunk role

    def write_chunk(self, data: Any = _ABSENT) -> int:
        """``writeChunk(data)`` -> the chunk's 0-based index (int).

        ``data`` is bytes from the client (empty bytes are a real chunk); any
        other JSON value is stored and echoed verbatim (§12 A11).

        Raises CellError ``Cannot write to a closed stream`` (500) once the
        stream is closed; ValidationError (400) when ``data`` is missing.
        """
        if data is _ABSENT:
            raise ValidationError("data: required")
        if isinstance(data, (bytes, bytearray, memoryview)):
            raw, text = bytes(data), None
        else:
            raw, text = None, codec.encode(data)
        index = Stream.objects.append_chunk(self.name, raw, text, clock.now(), tenant=self.tenant)
        if index is None:
            raise CellError("Cannot write to a closed stream")
        return index

    def close_stream(self) -> None:
        """``closeStream()`` -> None. Marks the stream closed; idempotent, valid on an empty stream."""
        Stream.objects.close(self.name, clock.now(), tenant=self.tenant)

    def get_chunks(self, params: Any = _ABSENT) -> dict[str, Any]:
        """``getChunks({startIndex, limit})`` -> ``{"chunks": [...], "done": bool, "tailIndex": int}``.

        ``start = max(0, startIndex)``; up to ``limit`` chunks (all remaining
        when ``limit`` is absent/null) with index >= start, in index order.
        ``done`` = closed, ``tailIndex`` = chunks written − 1. Cost follows
        ``limit``, not the stream length (one index range scan).

        Raises ValidationError (400) when the params object is missing
        (upstream: TypeError) or ``startIndex``/``limit`` are not integers
        (``limit`` must be >= 0).
        """
        if not isinstance(params, dict):
            raise ValidationError("params: expected an object {startIndex, limit}")
        start = _int_arg(params.get("startIndex"), "params.startIndex")
        limit = params.get("limit")
        if limit is not None and _int_arg(limit, "params.limit") < 0:
            raise ValidationError("params.limit: expected a non-negative integer")
        meta = Stream.objects.meta(self.name, tenant=self.tenant)
        if meta is None:
            return {"chunks": [], **_EMPTY_INFO}
        stream_id, count, closed = meta
        start = min(max(0, start), _INDEX_CAP)
        if limit is not None:
            limit = min(limit, _INDEX_CAP)
        rows = [] if start >= count or limit == 0 else Stream.objects.chunk_page(stream_id, start, count, limit)
        chunks = [bytes(data) if data is not None else codec.decode(value) for data, value in rows]
        return {"chunks": chunks, "done": closed, "tailIndex": count - 1}

    def get_info(self) -> dict[str, Any]:
        """``getInfo()`` -> ``{"tailIndex": count − 1, "done": closed}``; ``{-1, false}`` for an unknown stream."""
        meta = Stream.objects.meta(self.name, tenant=self.tenant)
        if meta is None:
            return dict(_EMPTY_INFO)
        _, count, closed = meta
        return {"tailIndex": count - 1, "done": closed}

    # ------------------------------------------------------------ registry role

    def register_stream(self, name: Any = _ABSENT) -> None:
        """``registerStream(name)`` -> None. Records a stream name of this run; idempotent.

        Raises ValidationError (400) for a non-string name.
        """
        name = require_storable(name, "name", max_bytes=NAME_MAX_BYTES)
        if self.name.startswith("run-streams:"):  # no registry for an expired run (docs/lifecycle.md)
            fence.raise_if_expired(self.name[len("run-streams:"):])
        StreamRegistration.objects.register(self.name, name, clock.now(), tenant=self.tenant)

    def list_streams(self) -> list[str]:
        """``listStreams()`` -> every registered name, ascending bytewise; ``[]`` when none."""
        return StreamRegistration.objects.names(self.name, tenant=self.tenant)
