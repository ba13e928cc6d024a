"""JavaScript semantics the run cell reproduces (docs/protocol.md §5.5–5.6).

Upstream is JavaScript: guards test truthiness, keys and messages are built
with ``String(x)``, defaults use ``??``. These functions give the same
answers on decoded wire values (``ABSENT`` = ``undefined``, None = ``null``).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from worldcell import codec

from .event_schemas import ABSENT

__all__ = ["given", "js_string", "js_truthy"]


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness: absent, null, false, 0 and "" are falsy; objects (even empty) are not."""
    if value is ABSENT or value is None or value is False:
        return False
    if isinstance(value, (int, float, str)):
        return bool(value)
    return True


def _js_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return repr(value).replace("e-0", "e-").replace("e+0", "e+")


def js_string(value: Any) -> str:
    """``String(value)``: how upstream builds a key or message from a non-string id.

    ``step:<correlationId>`` with no correlationId looks up ``step:undefined``
    upstream; this reproduces such keys and the messages that quote them.
    """
    if isinstance(value, str):
        return value
    if value is ABSENT:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _js_number(value)
    if isinstance(value, list):
        return ",".join("" if x is None else js_string(x) for x in value)
    if isinstance(value, (bytes, bytearray)):
        return ",".join(str(b) for b in value)
    if isinstance(value, datetime):
        return codec.to_utc_ms(value).strftime("%a %b %d %Y %H:%M:%S GMT+0000 (Coordinated Universal Time)")
    return "[object Object]"


def given(value: Any) -> bool:
    """True when JavaScript's ``value ?? fallback`` picks ``value`` (it is neither absent nor null)."""
    return value is not ABSENT and value is not None
