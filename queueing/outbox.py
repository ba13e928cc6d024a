"""Sending wake-up tasks off the request path (docs/operations-faults.md "Broker loss").

``queueing.wake`` hands every Celery wake-up of an API process to this
process's ``WakeOutbox``: a bounded in-memory queue drained by one daemon
thread that publishes ``queueing.tasks.wake_cell`` (never retried). An
enqueue therefore never waits for the broker — with Redis down, a publish
blocks for ``broker_connection_timeout`` plus kombu's reconnect interval
(≈ 6 s) before it fails. A wake-up may be lost (outbox full, broker down);
that only delays a delivery until the next pump or beat tick, because the
due times live in the database (docs/architecture.md rule 3).

After a failed publish the sender drops what is queued and what arrives for
``BROKER_DOWN_PAUSE_S``, then tries again, so an outage costs one blocked
publish per pause, not one per enqueue.

Interface (``publish(name, at_ms)`` sends one task; the Celery driver
passes its own, ``queueing.tasks.publish_wake``)::

    box = outbox(publish)
    box.put("q:0", at_ms=None)   # never blocks, never raises
    box.flush(timeout_s)         # tests: wait until the queue is empty
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

log = logging.getLogger("queueing.outbox")

__all__ = ["BROKER_DOWN_PAUSE_S", "MAX_QUEUED", "Publish", "WakeOutbox", "outbox"]

#: ``publish(cell_name, at_ms)``: send one wake-up task; raises when the broker is unreachable.
Publish = Callable[[str, "int | None"], None]

#: Wake-ups queued at most; more are dropped (the next tick covers them).
MAX_QUEUED = 10_000
#: After a failed publish, wake-ups are dropped for this long before the next try.
BROKER_DOWN_PAUSE_S = 1.0


class WakeOutbox:
    """One sender thread publishing wake-ups (``publish(name, at_ms)``) from a bounded queue."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._q: queue.Queue[tuple[str, int | None]] = queue.Queue(MAX_QUEUED)
        self._down_until = 0.0
        self._thread = threading.Thread(target=self._run, name="queue-wake-outbox", daemon=True)
        self._thread.start()
        self.sent = 0
        self.dropped = 0

    def put(self, name: str, at_ms: int | None) -> None:
        """Queue a wake-up of cell ``name`` (now, or at epoch ms ``at_ms``); drops it if full or the broker is down."""
        if time.monotonic() < self._down_until:
            self._drop(name, at_ms)
            return
        try:
            self._q.put_nowait((name, at_ms))
        except queue.Full:
            self._drop(name, at_ms)

    def _drop(self, name: str, at_ms: int | None) -> None:
        self.dropped += 1
        if at_ms is not None:  # this process no longer has a timed wake pending for the cell
            from . import wake

            wake.forget_scheduled(name)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued wake-up was handled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._q.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _run(self) -> None:
        while True:
            name, at_ms = self._q.get()
            try:
                if time.monotonic() < self._down_until:
                    self._drop(name, at_ms)
                    continue
                self._publish(name, at_ms)
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - the broker is down: the ticks fire the cells
                self._down_until = time.monotonic() + BROKER_DOWN_PAUSE_S
                self._drop(name, at_ms)
                dropped = self._drain()
                log.warning(
                    "queue wake-ups: the broker is unreachable (%s); dropped %d wake-up(s), pausing %.0f s "
                    "(the workers' pumps and beat fire the cells)", exc, 1 + dropped, BROKER_DOWN_PAUSE_S,
                )
            finally:
                self._q.task_done()

    def _drain(self) -> int:
        n = 0
        while True:
            try:
                name, at_ms = self._q.get_nowait()
            except queue.Empty:
                return n
            self._drop(name, at_ms)
            self._q.task_done()
            n += 1


_outbox: WakeOutbox | None = None
_outbox_pid: int | None = None
_outbox_lock = threading.Lock()


def outbox(publish: Publish) -> WakeOutbox:
    """This process's outbox sending with ``publish``, started on first use (and again in a forked child)."""
    global _outbox, _outbox_pid
    if _outbox is None or _outbox_pid != os.getpid():
        with _outbox_lock:
            if _outbox is None or _outbox_pid != os.getpid():
                _outbox = WakeOutbox(publish)
                _outbox_pid = os.getpid()
    return _outbox
