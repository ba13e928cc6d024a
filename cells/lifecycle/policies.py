"""Retention policies: which runs expire when (docs/lifecycle.md "Policies"), and the sweep's settings.

Policy (``Policy``): terminal runs expire ``WORLDCELL_RUN_RETENTION`` after
they completed/failed/were cancelled; every run expires ``WORLDCELL_MAX_RUN_AGE``
after it was created; when both apply the earlier deadline wins; both are
off by default. ``settle_ms`` is the wait before a run's final ``settle``
pass, ``describe_ms`` words a policy duration for people.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from ..event_machine import TERMINAL_RUN

__all__ = ["TERMINAL_STATUSES", "Policy", "describe_ms", "policy", "settle_ms"]

TERMINAL_STATUSES = tuple(sorted(TERMINAL_RUN))  # as SQL parameters, in a fixed order


def settle_ms() -> int:
    """Milliseconds between a run's tombstone and its final ``settle`` pass (default 60 000).

    Longer than any single RPC already in flight when the tombstone was written
    needs to land (the client's index puts follow its applyEvent at once).
    """
    return int(getattr(settings, "WORLDCELL_RETENTION_SETTLE_MS", 60_000))


@dataclass(frozen=True)
class Policy:
    """The retention settings (docs/lifecycle.md "Policies"); durations in ms, None = off."""

    retention_ms: int | None
    max_age_ms: int | None
    batch: int

    @property
    def enabled(self) -> bool:
        return self.retention_ms is not None or self.max_age_ms is not None

    def deadline(self, status: str, created_at: datetime, completed_at: datetime | None) -> tuple[datetime, str] | None:
        """``(expires_at, reason)`` of a run by this policy, or None when no policy applies.

        ``reason`` is ``terminal-retention`` or ``maximum-age``; the earlier deadline wins.
        """
        found: list[tuple[datetime, str]] = []
        if self.retention_ms is not None and status in TERMINAL_STATUSES and completed_at is not None:
            found.append((completed_at + timedelta(milliseconds=self.retention_ms), "terminal-retention"))
        if self.max_age_ms is not None:
            found.append((created_at + timedelta(milliseconds=self.max_age_ms), "maximum-age"))
        return min(found, key=lambda f: f[0]) if found else None


def policy() -> Policy:
    """The policy from the settings (``WORLDCELL_RUN_RETENTION``, ``WORLDCELL_MAX_RUN_AGE``, batch)."""
    return Policy(
        retention_ms=getattr(settings, "WORLDCELL_RUN_RETENTION_MS", None),
        max_age_ms=getattr(settings, "WORLDCELL_MAX_RUN_AGE_MS", None),
        batch=min(1000, max(1, int(getattr(settings, "WORLDCELL_RETENTION_BATCH", 128)))),
    )


def describe_ms(ms: int | None) -> str:
    """``30d``, ``12h``, ``90m``, ``45s``, ``500ms`` or ``off``: a policy duration for people."""
    if ms is None:
        return "off"
    for unit, size in (("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
