"""Strings the cells keep in columns and keys of their own: the storable-text rule and ``ms13``.

* ``storable_text(text)`` — whether a PostgreSQL ``text`` column can hold
  ``text`` as is. It cannot hold U+0000, and an unpaired surrogate is not
  UTF-8, so ids, names, tokens and keys kept in their own (indexed) columns
  must be free of both. Payloads are unaffected: they are stored
  codec-encoded, where such characters travel as ``\\uXXXX`` escapes.
* ``fits_utf8(text, max_bytes)`` — whether ``text`` is at most ``max_bytes``
  UTF-8 bytes (a btree entry must fit a page; ``text`` must be storable).
* ``require_storable(value, field, max_bytes=None)`` — both checks as
  validation of a request argument: the value, or ``ValidationError`` (400)
  naming ``field``.
* ``clamp_ms(ms)`` / ``ms13(ms)`` — epoch milliseconds floored into
  ``[0, MAX_EPOCH_MS]`` and as the 13-digit, zero-padded key fragment of
  docs/protocol.md §7.1 (``due:<ms13>:…``, ``dlq:<ms13>:…``,
  ``runall:<ms13>:…``).
"""
from __future__ import annotations

import math
from typing import Any

from .errors import ValidationError

__all__ = ["MAX_EPOCH_MS", "clamp_ms", "fits_utf8", "ms13", "require_storable", "storable_text"]

#: Largest epoch ms a 13-digit ``ms13`` key fragment holds (year 2286); larger times are clamped.
MAX_EPOCH_MS = 9_999_999_999_999


def storable_text(text: str) -> bool:
    """Whether a text column can hold ``text`` as is (no U+0000, no unpaired surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def fits_utf8(text: str, max_bytes: int) -> bool:
    """Whether the UTF-8 form of (storable) ``text`` is at most ``max_bytes`` bytes.

    Encodes only when the text could be too long (4 bytes per character at most).
    """
    return len(text) * 4 <= max_bytes or len(text.encode("utf-8")) <= max_bytes


def require_storable(value: Any, field: str, max_bytes: int | None = None) -> str:
    """``value`` if it is a storable string of at most ``max_bytes`` UTF-8 bytes.

    Raises ValidationError (400): ``<field>: expected a string``,
    ``<field>: must not contain U+0000``, ``<field>: must not contain an
    unpaired surrogate`` or ``<field>: longer than <max_bytes> UTF-8 bytes``.
    """
    if not isinstance(value, str):
        raise ValidationError(f"{field}: expected a string")
    if "\x00" in value:
        raise ValidationError(f"{field}: must not contain U+0000")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(f"{field}: must not contain an unpaired surrogate") from None
    if max_bytes is not None and size > max_bytes:
        raise ValidationError(f"{field}: longer than {max_bytes} UTF-8 bytes")
    return value


def clamp_ms(ms: float) -> int:
    """Floor ``ms`` into ``[0, MAX_EPOCH_MS]`` (the ``ms13`` rule of docs/protocol.md §7.1, plus an upper bound).

    Total over floats: NaN and ``-inf`` give 0 ("due now"), ``+inf`` the bound.
    """
    if ms != ms or ms <= 0:  # NaN, negative (incl. -inf)
        return 0
    if ms >= MAX_EPOCH_MS:  # incl. +inf
        return MAX_EPOCH_MS
    return math.floor(ms)


def ms13(ms: float) -> str:
    """Epoch ms as the 13-digit key fragment of docs/protocol.md §7.1 (``clamp_ms``, zero-padded)."""
    return str(clamp_ms(ms)).zfill(13)
