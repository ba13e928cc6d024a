"""The lifecycle tick: one retention sweep and one reconcile pass (docs/lifecycle.md "Scheduling").

``tick()`` is what Celery beat's ``cells.tasks.lifecycle_sweep`` and the dev
fleet's ``LifecycleTicker`` thread run every ``WORLDCELL_LIFECYCLE_INTERVAL_S``
seconds. A sweep that found a full batch asks to run again at once
(``more``), so a backlog drains at the sweep's own pace, batch by batch.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from . import lifecycle, repair

log = logging.getLogger("cells.ticker")

__all__ = ["LifecycleTicker", "tick"]


def tick() -> bool:
    """One retention sweep, one reconcile pass, the queue console's pruning; True when the sweep left due work.

    Errors of either half are logged, never raised (the next tick retries).
    """
    more = False
    try:
        more = lifecycle.sweep().more
    except Exception:  # noqa: BLE001 - see docstring
        log.exception("retention sweep failed")
    try:
        repair.reconcile()
    except Exception:  # noqa: BLE001 - see docstring
        log.exception("stuck-run reconcile failed")
    try:
        from queueing import attempt_log, liveness

        attempt_log.prune()  # old outcome minutes, attempts of gone messages (docs/queue-console.md)
        liveness.prune()
    except Exception:  # noqa: BLE001 - see docstring
        log.exception("queue console pruning failed")
    return more


class LifecycleTicker:
    """A daemon thread that runs ``tick()`` every ``interval_s`` seconds (the dev fleet's beat)."""

    def __init__(self, interval_s: float | None = None):
        self.interval_s = float(interval_s or getattr(settings, "WORLDCELL_LIFECYCLE_INTERVAL_S", 30.0))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "LifecycleTicker":
        self._thread = threading.Thread(target=self._loop, name="lifecycle-ticker", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                more = tick()
            finally:
                close_old_connections()
            if not more:
                self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
