"""The queue cell's configuration, read at use time (docs/protocol.md §7.2).

``QUEUE_MAX_ATTEMPTS``, ``QUEUE_MAX_INFLIGHT`` and ``QUEUE_DELIVERY_TIMEOUT_MS``
are kept as raw strings in ``worldcell.settings`` and parsed here on every use
with JavaScript ``parseInt(raw, 10)`` semantics: leading whitespace is skipped,
an optional sign and the leading run of decimal digits are taken
(``"12abc"`` -> 12), and the value is used only when it is a number > 0;
anything else (``""``, ``"abc"``, ``"0"``, ``"-3"``) gives the default.
"""
from __future__ import annotations

import re

from django.conf import settings

from worldcell.keys import MAX_EPOCH_MS

__all__ = [
    "DEFAULT_DELIVERY_TIMEOUT_MS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_INFLIGHT",
    "INFLIGHT_GRACE_MS",
    "MAX_EPOCH_MS",
    "MIN_ALARM_DELAY_MS",
    "callback_secret",
    "delivery_timeout_ms",
    "js_parse_int",
    "max_attempts",
    "max_inflight",
    "positive_int_setting",
]

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_MAX_INFLIGHT = 5
DEFAULT_DELIVERY_TIMEOUT_MS = 300_000
#: A claim counts as lost this long after the delivery timeout (§7.2).
INFLIGHT_GRACE_MS = 30_000
#: Overdue alarms are re-armed at now + this many ms (§7.8).
MIN_ALARM_DELAY_MS = 1
# MAX_EPOCH_MS (from worldcell.keys): the largest instant a due time / deadline /
# alarm may take (13 digits, so integer order = ``ms13`` key order, §7.1).
#: parseInt results above this are clamped (keeps SQL LIMITs and sums in range).
_MAX_SETTING = 2**31 - 1

# StrWhiteSpaceChar of ECMA-262: WhiteSpace (incl. U+FEFF and every Zs) and LineTerminator.
_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_LEADING_INT = re.compile(r"[+-]?[0-9]+")


def js_parse_int(raw: object) -> int | None:
    """JavaScript ``parseInt(String(raw), 10)``; ``None`` stands for ``NaN``.

    ``None`` and ``""`` give ``None`` (upstream tests ``raw ?`` first).
    Examples: ``" 42"`` -> 42, ``"12abc"`` -> 12, ``"-7"`` -> -7,
    ``"1e3"`` -> 1, ``"0x10"`` -> 0, ``"abc"`` -> None.
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raw = "true" if raw else "false"
    text = str(raw).lstrip(_JS_WHITESPACE)
    m = _LEADING_INT.match(text)
    return int(m.group(0)) if m else None


def _positive_int_setting(name: str, default: int) -> int:
    parsed = js_parse_int(getattr(settings, name, None))
    if parsed is None or parsed <= 0:
        return default
    return min(parsed, _MAX_SETTING)


#: The public name of the parser above, for settings of other modules (``lease.claim_lease_ms``).
positive_int_setting = _positive_int_setting


def max_attempts() -> int:
    """Counted failures after which a message becomes a dead letter (default 5)."""
    return _positive_int_setting("QUEUE_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)


def max_inflight() -> int:
    """Deliveries one queue cell may have in flight at once (default 5)."""
    return _positive_int_setting("QUEUE_MAX_INFLIGHT", DEFAULT_MAX_INFLIGHT)


def delivery_timeout_ms() -> int:
    """HTTP timeout of one delivery in ms (default 300 000); claims last this + 30 000 ms."""
    return _positive_int_setting("QUEUE_DELIVERY_TIMEOUT_MS", DEFAULT_DELIVERY_TIMEOUT_MS)


def callback_secret() -> str | None:
    """``WORKFLOW_CALLBACK_SECRET`` when non-empty (sent as ``x-workflow-callback-secret``), else None."""
    value = getattr(settings, "WORKFLOW_CALLBACK_SECRET", None)
    return str(value) if value else None
