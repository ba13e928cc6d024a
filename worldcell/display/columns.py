"""Bounded reads of payload columns: a preview of a 5 MB column without reading it whole.

``payload_annotations`` / ``binary_annotations`` add queryset annotations for
the first characters, the stored size and the last characters of a column;
``stored_text`` reads them back as a ``StoredText``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import BinaryField, F, Func, IntegerField, TextField, Value
from django.db.models.functions import Greatest, Substr

__all__ = [
    "BLOCK_HEAD_CHARS",
    "INLINE_HEAD_CHARS",
    "TAIL_CHARS",
    "StoredSize",
    "StoredText",
    "as_stored",
    "binary_annotations",
    "payload_annotations",
    "stored_text",
]

#: Characters of a payload column read for a full (block) preview.
BLOCK_HEAD_CHARS = 65_536
#: Characters read for a one-line preview in a table.
INLINE_HEAD_CHARS = 2_048
#: Characters read from the end (enough for a base64 tag's padding).
TAIL_CHARS = 8


class StoredSize(Func):
    """Length in bytes of a text or binary column, without reading a TOASTed value on PostgreSQL.

    PostgreSQL: ``OCTET_LENGTH`` (answered from the TOAST pointer); SQLite:
    ``LENGTH`` (characters for text, which equals bytes for ASCII codec text;
    bytes for a BLOB).
    """

    function = "LENGTH"
    output_field = IntegerField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="OCTET_LENGTH", **extra)


class _BinaryHead(Func):
    """The first bytes of a binary column (``SUBSTR`` works on bytea and BLOB)."""

    function = "SUBSTR"

    def __init__(self, expression, length: int):
        super().__init__(expression, Value(1), Value(length), output_field=BinaryField())


def payload_annotations(field: str, *, head: int = BLOCK_HEAD_CHARS, tail: int = TAIL_CHARS) -> dict[str, Any]:
    """Queryset annotations that read a preview of the text column ``field`` instead of all of it.

    Adds ``pv_<field>_head`` (first ``head`` characters), ``pv_<field>_size``
    (stored bytes; NULL when the column is NULL = absent) and
    ``pv_<field>_tail`` (last ``tail`` characters). Combine with
    ``.defer(field)``; read back with ``stored_text(row, field)``.
    """
    size = StoredSize(F(field))
    return {
        f"pv_{field}_head": Substr(F(field), 1, head, output_field=TextField()),
        f"pv_{field}_size": size,
        f"pv_{field}_tail": Substr(F(field), Greatest(size - tail + 1, Value(1)), tail, output_field=TextField()),
    }


def binary_annotations(field: str, *, head: int = 64) -> dict[str, Any]:
    """Annotations ``pv_<field>_head`` (first ``head`` bytes) and ``pv_<field>_size`` of a binary column."""
    return {f"pv_{field}_head": _BinaryHead(F(field), head), f"pv_{field}_size": StoredSize(F(field))}


@dataclass(frozen=True)
class StoredText:
    """A stored codec text, or the part of it that was read.

    Attributes:
        head: the first characters (the whole text when ``complete``).
        size: the stored size in bytes (= characters: codec text is ASCII).
        tail: the last few characters ("" when not read).
    """

    head: str
    size: int
    tail: str = ""

    @property
    def complete(self) -> bool:
        return len(self.head) >= self.size

    @classmethod
    def whole(cls, text: str) -> "StoredText":
        return cls(text, len(text), text[-TAIL_CHARS:])


def stored_text(row: Any, field: str) -> StoredText | None:
    """The ``StoredText`` of ``field`` on a row annotated by ``payload_annotations`` (None = absent).

    Falls back to the loaded column value when the row was not annotated.
    """
    size = getattr(row, f"pv_{field}_size", _MISSING)
    if size is _MISSING:
        text = getattr(row, field)
        return None if text is None else StoredText.whole(text)
    if size is None:
        return None
    return StoredText(getattr(row, f"pv_{field}_head") or "", int(size), getattr(row, f"pv_{field}_tail") or "")


_MISSING = object()


def as_stored(stored: StoredText | str | None) -> StoredText | None:
    """``stored`` as a ``StoredText``: a whole text is wrapped, None (absent) stays None."""
    return StoredText.whole(stored) if isinstance(stored, str) else stored
