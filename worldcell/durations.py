"""Durations read from the environment (docs/lifecycle.md "Settings").

``parse_duration_ms(text, name)`` turns an operator's duration into integer
milliseconds. Accepted forms:

* a number with a unit: ``500ms``, ``90s``, ``15m``, ``12h``, ``30d``, ``2w``
  (fractions allowed: ``1.5h``), several may be joined: ``1d12h``;
* a bare number: seconds (``3600``);
* ISO 8601 / Django forms understood by ``django.utils.dateparse.parse_duration``
  (``P30D``, ``PT12H``, ``1 02:00:00``);
* ``off``, ``none``, ``disabled`` or the empty string: no duration (None).

Anything else raises ``ImproperlyConfigured`` naming the variable: a
retention value that does not parse must stop the fleet at startup, never
fall back to a default silently.
"""
from __future__ import annotations

import re

from django.core.exceptions import ImproperlyConfigured
from django.utils.dateparse import parse_duration

__all__ = ["parse_duration_ms", "OFF_WORDS"]

#: Values that mean "this policy is off".
OFF_WORDS = frozenset({"", "off", "none", "disabled", "false", "no"})

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_WHOLE = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)\s*)+$", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")


def parse_duration_ms(text: str | None, name: str) -> int | None:
    """``text`` as whole milliseconds (>= 0), or None when it says "off".

    Args:
        text: the raw environment value (None counts as unset = off).
        name: the variable's name, for the error message.

    Raises:
        ImproperlyConfigured: ``text`` is not one of the forms in the module docstring.
    """
    if text is None or text.strip().lower() in OFF_WORDS:
        return None
    raw = text.strip()
    if _NUMBER.match(raw):
        return round(float(raw) * 1000)
    if _WHOLE.match(raw):
        return round(sum(float(n) * _UNIT_MS[u.lower()] for n, u in _PART.findall(raw)))
    delta = parse_duration(raw)
    if delta is not None and delta.total_seconds() >= 0:
        return round(delta.total_seconds() * 1000)
    raise ImproperlyConfigured(
        f"{name}={text!r} is not a duration: use e.g. 30d, 12h, 90m, 3600 (seconds), P30D, or 'off'"
    )
