"""The in-process alarm pump: the queue's driver when there is no broker (PROTOCOL.md §9.2).

Used by ``manage.py devfleet`` and by tests without Celery. It calls exactly
what the Celery tasks call — ``machine.fire_due_alarms``,
``machine.fire_cell_alarm`` and ``delivery.deliver_and_claim_next`` — so both
drivers share one state machine.

Interface::

    pump = LocalPump(interval_s=0.025, max_workers=16, log_deliveries=True)
    pump.start()          # starts the tick thread and the delivery threads; receives wake_cell()
    pump.wake("q:0")      # fire this cell now (called on commit when Celery is off)
    pump.stop(timeout_s)  # -> deliveries still unfinished (they are redelivered after their deadline)

The tick loop, every ``interval_s`` or as soon as it is woken:

1. fires the alarm of every woken cell (a fresh ``now + 1`` alarm counts as due);
2. fires every cell whose alarm is due (``machine.fire_due_alarms``);
3. hands each claim to the delivery threads (at most ``max_workers`` POSTs at
   once); each thread runs ``delivery.deliver_and_claim_next`` (the POST, the
   outcome, then a claim for the freed slot, queued right away) and
   optionally logs one line per delivery.

Ticks never overlap (one loop thread). Errors are logged with the cell name
and the loop goes on.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

from django.db import close_old_connections, connections

from . import delivery, machine, wake
from .machine import Claim

log = logging.getLogger("queueing.pump")

__all__ = ["LocalPump"]


class LocalPump:
    """Fires due queue alarms every ``interval_s`` seconds and delivers on ``max_workers`` threads.

    Args:
        interval_s: seconds between ticks (default 0.025, the dev fleet's 25 ms).
        max_workers: concurrent deliveries (size it for shards × QUEUE_MAX_INFLIGHT).
        log_deliveries: log one INFO line per delivery
            (``queue q:0 msg_1 attempt=1 -> 200 acked (12 ms)``).
        register: receive this process's ``wake_cell`` calls while running.
    """

    def __init__(
        self,
        interval_s: float = 0.025,
        max_workers: int = 16,
        log_deliveries: bool = False,
        *,
        register: bool = True,
    ) -> None:
        self.interval_s = interval_s
        self.max_workers = max(1, int(max_workers))
        self.log_deliveries = log_deliveries
        self.register = register
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._woken: set[str] = set()
        self._poke = threading.Event()
        self._stopping = threading.Event()
        self._jobs: queue.Queue[Claim | None] = queue.Queue()
        self._outstanding = 0  # claims queued or being delivered
        self._loop: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self.delivered = 0  # finished deliveries (any outcome), for observers

    # ------------------------------------------------------------------ control

    def start(self) -> "LocalPump":
        """Start the tick thread and the delivery threads; returns self."""
        if self._loop is not None:
            raise RuntimeError("pump already started")
        self._stopping.clear()
        for i in range(self.max_workers):
            t = threading.Thread(target=self._work, name=f"queue-delivery-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        self._loop = threading.Thread(target=self._run, name="queue-pump", daemon=True)
        self._loop.start()
        if self.register:
            wake.register_pump(self)
        return self

    def wake(self, cell_name: str | None = None) -> None:
        """Run a tick now; with ``cell_name``, that cell's fresh ``now + 1`` alarm counts as due."""
        if cell_name is not None:
            with self._lock:
                self._woken.add(cell_name)
        self._poke.set()

    def stop(self, timeout_s: float = 10.0) -> int:
        """Stop claiming, wait up to ``timeout_s`` for claimed deliveries, stop the threads.

        Returns how many claimed deliveries did not finish in time; those
        messages stay in flight in the database and are redelivered after
        their claim deadline.
        """
        if self._loop is None:
            return 0
        if self.register:
            wake.unregister_pump(self)
        self._stopping.set()
        self._poke.set()
        deadline = time.monotonic() + timeout_s
        self._loop.join(max(0.0, deadline - time.monotonic()))
        self.wait_idle(max(0.0, deadline - time.monotonic()))
        dropped = 0
        while True:  # claims never started: leave them to their deadline
            try:
                if self._jobs.get_nowait() is not None:
                    dropped += 1
            except queue.Empty:
                break
        with self._lock:
            self._outstanding -= dropped
            left = self._outstanding + dropped
        for _ in self._workers:
            self._jobs.put(None)
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))
        self._workers = []
        self._loop = None
        return left

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no claimed delivery is queued or running; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._outstanding:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    @property
    def outstanding(self) -> int:
        """Claims queued or being delivered right now."""
        return self._outstanding

    # ------------------------------------------------------------------ ticks

    def tick(self) -> int:
        """One pass: fire woken cells, then every due cell; queue their deliveries. Returns claims made."""
        with self._lock:
            woken, self._woken = self._woken, set()
        count = 0
        for name in sorted(woken):
            try:
                count += len(machine.fire_cell_alarm(name, early_ms=1, skip_locked=True, dispatch=self._submit))
            except Exception:  # noqa: BLE001 - logged with the cell name; the next tick retries
                log.exception("queue cell %s: alarm handler failed", name)
        count += len(machine.fire_due_alarms(dispatch=self._submit))
        return count

    def _submit(self, claims: list[Claim]) -> None:
        with self._lock:
            self._outstanding += len(claims)
        for claim in claims:
            self._jobs.put(claim)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._poke.wait(self.interval_s)
                self._poke.clear()
                if self._stopping.is_set():
                    break
                try:
                    close_old_connections()
                    self.tick()
                except Exception:  # noqa: BLE001 - e.g. the database is briefly unavailable
                    log.exception("queue pump: tick failed")
        finally:
            connections.close_all()

    def _work(self) -> None:
        try:
            while True:
                claim = self._jobs.get()
                if claim is None:
                    break
                try:
                    close_old_connections()
                    report, more = delivery.deliver_and_claim_next(
                        claim, should_claim=lambda: not self._stopping.is_set()
                    )
                    self._submit(more)
                    if report is not None and self.log_deliveries:
                        log.info("%s", report.log_line())
                except Exception:  # noqa: BLE001 - the claim is recovered after its deadline
                    log.exception("queue cell %s: delivery of %s failed", claim.cell_name, claim.message_id)
                finally:
                    with self._idle:
                        self._outstanding -= 1
                        self.delivered += 1
                        if not self._outstanding:
                            self._idle.notify_all()
        finally:
            connections.close_all()
