"""The server clock: one ``now`` per RPC call, in whole milliseconds (docs/protocol.md §0).

Tests may install a controllable clock with ``set_clock``; everything that
needs "now" (event timestamps, queue due times, alarms) reads it from here.
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Callable

from .codec import from_epoch_ms

_clock: Callable[[], int] | None = None


def now_ms() -> int:
    """Current time as integer epoch milliseconds (the test clock when one is set)."""
    if _clock is not None:
        return int(_clock())
    return time.time_ns() // 1_000_000


def now() -> datetime:
    """Current time as an aware UTC datetime with millisecond precision."""
    return from_epoch_ms(now_ms())


def set_clock(fn: Callable[[], int] | None) -> None:
    """Install ``fn`` (returning epoch ms) as the clock; ``None`` restores the wall clock."""
    global _clock
    _clock = fn
