"""The RPC wire codec: tagged JSON in both directions (docs/protocol.md §3).

Python values on our side of the wire:

* ``datetime`` (timezone-aware, UTC, millisecond precision) <-> ``{"__type":"Date","iso":"…Z"}``
* ``bytes`` <-> ``{"__type":"Uint8Array","data":"<base64>"}``
* everything else is plain JSON (dict, list, str, int, float, bool, None).

An *absent* member is simply a key that is not in the dict; the codec never
invents ``null`` for it (§3.5). Encoded output is compact and pure ASCII (non-
ASCII characters, lone surrogates and U+0000 travel as ``\\uXXXX`` escapes), so
the same text can be stored in a PostgreSQL ``text`` column unchanged
(docs/architecture.md rule 5).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

__all__ = [
    "DATE_FIELDS",
    "DecodeError",
    "decode",
    "encode",
    "format_iso",
    "parse_date_string",
    "to_utc_ms",
    "from_epoch_ms",
    "epoch_ms",
]

#: Property names whose untagged ISO strings are revived as datetimes at any
#: depth (docs/protocol.md §3.2 rule 3).
DATE_FIELDS = frozenset({"createdAt", "updatedAt", "startedAt", "completedAt", "retryAfter"})

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class DecodeError(ValueError):
    """The text is not valid RPC-codec JSON (router answers 400 ``malformed rpc body``)."""


# --------------------------------------------------------------------------- dates


def to_utc_ms(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime truncated to whole milliseconds.

    Naive datetimes are taken as UTC (the reference machines run in UTC, §3.2).
    A value that already is UTC with whole milliseconds (every time the services
    make or read back) is returned as it is.
    """
    if value.tzinfo is timezone.utc:
        micro = value.microsecond
        return value if micro % 1000 == 0 else value.replace(microsecond=micro - micro % 1000)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    else:
        value = value.astimezone(timezone.utc)
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def format_iso(value: datetime) -> str:
    """Format like JavaScript ``toISOString()``: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (§0).

    ``isoformat`` of the UTC value (4-digit year, ``+00:00`` suffix swapped for ``Z``):
    about 3x cheaper than formatting the seven fields one by one (docs/benchmarks.md "Micro").
    """
    return to_utc_ms(value).isoformat(timespec="milliseconds")[:-6] + "Z"


def epoch_ms(value: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware (or UTC-naive) datetime."""
    v = to_utc_ms(value)
    delta = v - _EPOCH
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def from_epoch_ms(ms: int | float) -> datetime:
    """The UTC datetime ``ms`` milliseconds after the epoch (fraction floored).

    Raises ValueError/OverflowError when outside Python's datetime range.
    """
    if isinstance(ms, float):
        if not math.isfinite(ms):
            raise ValueError("invalid epoch milliseconds")
        ms = math.floor(ms)
    return _EPOCH + timedelta(milliseconds=int(ms))


_ISO_RE = re.compile(
    r"^(?P<y>[+-]\d{6}|\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
    r"(?:[T ](?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:[.,](?P<f>\d+))?)?"
    r"(?P<tz>Z|z|[+-]\d{2}(?::?\d{2})?)?)?$"
)


def parse_date_string(text: str) -> datetime | None:
    """Parse an ISO-8601 date or date-time string (docs/protocol.md §3.2, §12 A4).

    Accepts ``YYYY-MM-DD`` (UTC midnight), date-times with or without seconds
    and fractional seconds, with ``Z``, a numeric offset, or no offset (UTC).
    Returns an aware UTC datetime truncated to milliseconds, or ``None`` when
    the text is not such a date or is outside the representable range.
    """
    if not isinstance(text, str) or len(text) > 64:
        return None
    m = _ISO_RE.match(text.strip())
    if m is None:
        return None
    try:
        year = int(m["y"])
        frac = m["f"] or ""
        micro = int((frac + "000000")[:6]) if frac else 0
        dt = datetime(
            year,
            int(m["mo"]),
            int(m["d"]),
            int(m["h"] or 0),
            int(m["mi"] or 0),
            int(m["s"] or 0),
            micro,
            tzinfo=timezone.utc,
        )
        tz = m["tz"]
        if tz and tz not in ("Z", "z"):
            sign = 1 if tz[0] == "+" else -1
            digits = tz[1:].replace(":", "")
            hours = int(digits[:2])
            minutes = int(digits[2:4] or 0)
            if hours > 23 or minutes > 59:
                return None
            dt = dt - sign * timedelta(hours=hours, minutes=minutes)
        return to_utc_ms(dt)
    except (ValueError, OverflowError):
        return None


# --------------------------------------------------------------------------- bytes

_B64_WS = re.compile(r"[\t\n\f\r ]")
_B64_ALPHABET = re.compile(r"^[A-Za-z0-9+/]*$")


def _b64decode_lenient(data: str) -> bytes:
    """Decode base64 like the browser's ``atob`` (forgiving-base64, §3.2 rule 2).

    ASCII whitespace is ignored and ``=`` padding is optional. Raises
    DecodeError on anything else that is invalid.
    """
    s = _B64_WS.sub("", data)
    if len(s) % 4 == 0:
        if s.endswith("=="):
            s = s[:-2]
        elif s.endswith("="):
            s = s[:-1]
    if len(s) % 4 == 1 or not _B64_ALPHABET.match(s):
        raise DecodeError("invalid base64 in Uint8Array tag")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except binascii.Error as exc:  # pragma: no cover - alphabet already checked
        raise DecodeError("invalid base64 in Uint8Array tag") from exc


# --------------------------------------------------------------------------- decode


def _object_hook(obj: dict[str, Any]) -> Any:
    # json calls this bottom-up (children first), which is exactly the order
    # §3.2 prescribes; DATE_FIELDS look at this object's own members.
    tag = obj.get("__type")
    if tag == "Date":
        iso = obj.get("iso")
        if isinstance(iso, str):
            parsed = parse_date_string(iso)
            if parsed is None:
                # §12 A5: an unparseable tagged date is rejected as bad input.
                raise DecodeError(f"invalid date in Date tag: {iso[:64]!r}")
            return parsed
    elif tag == "Uint8Array":
        data = obj.get("data")
        if isinstance(data, str):
            return _b64decode_lenient(data)
    for key in DATE_FIELDS.intersection(obj):
        value = obj[key]
        if isinstance(value, str):
            parsed = parse_date_string(value)
            if parsed is not None:
                obj[key] = parsed
    return obj


def _parse_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float | int:
    value = float(text)
    if not math.isfinite(value):
        raise DecodeError("number out of range")
    # JavaScript has one number type: 1.0 and 1 are the same value and
    # serialize as "1"; keep that so payloads echo back the way the client wrote them.
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


_DECODER = json.JSONDecoder(
    object_hook=_object_hook, parse_constant=_parse_constant, parse_float=_parse_float
)


def decode(text: str | bytes | bytearray) -> Any:
    """Parse RPC-codec JSON into Python values (docs/protocol.md §3.2, §2.6).

    ``text`` may be ``str`` or UTF-8 bytes (invalid sequences become U+FFFD,
    a leading BOM is dropped). Returns the decoded value. Raises DecodeError
    on empty input, syntax errors, ``NaN``/``Infinity``, invalid base64 in a
    bytes tag, an unparseable Date tag, or nesting too deep to parse.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        return _DECODER.decode(text)
    except DecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        raise DecodeError(str(exc)[:200]) from exc


# --------------------------------------------------------------------------- encode


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"__type": "Date", "iso": format_iso(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__type": "Uint8Array", "data": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot encode {type(value).__name__} on the wire")


_ENCODER = json.JSONEncoder(
    default=_default, separators=(",", ":"), ensure_ascii=True, allow_nan=False, check_circular=False
)


def encode(value: Any) -> str:
    """Serialize ``value`` as compact, ASCII-only RPC-codec JSON (docs/protocol.md §3.1).

    Datetimes become Date tags (ms precision, UTC ``Z``), bytes become
    Uint8Array tags, tuples become arrays. Raises TypeError for values the
    wire cannot carry and ValueError for NaN/Infinity.
    """
    return _ENCODER.encode(value)
