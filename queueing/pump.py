"""The in-process alarm pump: the queue's delivery engine (docs/protocol.md §9.2).

Used by ``manage.py devfleet`` (no broker), by every Celery worker process
(``queueing.tasks.worker_pump``: the broker only carries wake-ups) and by
tests. It runs ``machine.fire_cell_alarm`` and
``delivery.deliver_and_claim_next``, so every driver shares one state machine.

Interface::

    pump = LocalPump(interval_s=0.025, max_workers=16, log_deliveries=True)
    pump.start()          # starts the tick thread and the delivery threads; receives wake_cell()
    pump.wake("q:0")      # run a tick now (called on commit by wake.wake_cell)
    pump.wake("q:0", at_ms=t)  # run a tick at epoch ms t (a near future alarm)
    pump.stop(timeout_s)  # -> deliveries still unfinished (they are redelivered after their deadline)
    pump.leases           # the lease.LeaseRenewer of the claims its threads deliver (docs/leases.md)

**Never more claims than idle threads.** A claim's deadline runs from the
moment it is made, so a claim that waits in a queue for a delivery thread
loses time it may need for its POST (and may even expire before it starts
and be delivered twice). The pump therefore claims only for delivery threads
that are idle right now: before each claim it *reserves* the idle threads
(``max_workers`` minus claims queued or running), passes that number as the
claim's cap and gives back what it did not use. Due messages beyond that stay
pending in the database — not in flight — until a thread is free.

**Fairness across cells.** A delivery thread that finishes normally refills
its own cell's freed slot in the outcome transaction (no round trip). When
a tick found a due cell it could not serve for lack of threads, the pump is
*starving*: finishing threads then claim nothing, the outcome transaction
wakes the tick instead, and the tick serves due cells longest-waiting alarm
first. So slow targets in some cells cannot keep other cells' messages
waiting behind them indefinitely; every cell still gets at most
``QUEUE_MAX_INFLIGHT`` threads. Size ``max_workers`` for shards ×
``QUEUE_MAX_INFLIGHT`` to never make a cell wait for a thread.

The tick loop, every ``interval_s``, as soon as it is woken, or at a
requested time (a near alarm, a retry):

1. lists the cells whose alarm falls before the next interval tick, earliest
   first, and then reads the clock (so an alarm an enqueue has just re-armed
   to its own ``now + 1`` counts as due, §7.8); the first one still in the
   future gets a timed tick;
2. fires each due cell with a cap of the idle threads
   (``machine.fire_cell_alarm``, claims started for the threads) until no
   thread is idle (then the pump is starving until a tick serves every due
   cell); a due cell found locked by another transaction is retried after
   ``RETRY_LOCKED_S`` (an enqueue into a cell whose alarm is already due
   sends no wake-up: see ``machine.enqueue_batch``);
3. hands each claim to the delivery threads; each thread runs
   ``delivery.deliver_and_claim_next`` (the POST, the outcome, and — unless
   starving or stopping — claims for the freed slot, capped by itself plus
   the idle threads) and optionally logs one line per delivery.

The dev fleet runs one pump next to its web server; a Celery worker runs one
too and its wake-up tasks only poke it (``queueing.tasks``).

Ticks never overlap (one loop thread). Errors are logged with the cell name
and the loop goes on.
"""
from __future__ import annotations

import heapq
import logging
import queue
import threading
import time

from django.db import DatabaseError, close_old_connections, connections

from worldcell import clock

from . import config, delivery, lease, liveness, machine, wake
from .machine import Claim

log = logging.getLogger("queueing.pump")

__all__ = ["LocalPump", "RETRY_LOCKED_S"]

#: How soon a tick retries a due cell it found locked.
RETRY_LOCKED_S = 0.005


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
        self._poke = threading.Event()
        self._timers: list[float] = []  # monotonic times of requested ticks (a heap)
        self._last_tick = 0.0  # monotonic start of the last tick
        self._stopping = threading.Event()
        self._jobs: queue.Queue[Claim | None] = queue.Queue()
        self._outstanding = 0  # delivery threads busy or reserved: claims queued, being delivered or being made
        self._starving = False  # the last tick left a due cell unserved for lack of threads
        self._loop: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self.delivered = 0  # finished deliveries (any outcome), for observers
        #: renews the leases of the claims this pump's threads deliver (docs/leases.md)
        self.leases = lease.LeaseRenewer()

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
        self.leases.start()
        if self.register:
            wake.register_pump(self)
        return self

    def wake(self, cell_name: str | None = None, at_ms: int | None = None) -> None:
        """Run a tick now (a woken cell's fresh ``now + 1`` alarm counts as due), or at epoch ms ``at_ms``."""
        if at_ms is None or not self._tick_at(at_ms):
            self._poke.set()

    def _tick_at(self, at_ms: int) -> bool:
        """Have the loop tick at epoch ms ``at_ms``; False when that is now (tick at once instead)."""
        delay_s = (at_ms - clock.now_ms()) / 1000.0
        if delay_s <= 0.001:
            return False
        with self._lock:
            heapq.heappush(self._timers, time.monotonic() + delay_s + 0.002)
            if len(self._timers) > 10_000:  # keep the earliest; the interval tick covers the rest
                self._timers = heapq.nsmallest(1_000, self._timers)
                heapq.heapify(self._timers)
        return True

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
        self.leases.stop()  # deliveries left unfinished lapse within one lease
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
        """One pass: fire every due cell (earliest alarm first) within the idle threads. Returns claims made."""
        count = 0
        starving = False
        lookahead = clock.now_ms() + int(self.interval_s * 1000) + config.MIN_ALARM_DELAY_MS
        alarms = machine.cell_alarms(lookahead)
        # the clock is read after the scan, so an alarm an enqueue re-armed to
        # its own now + 1 meanwhile (§7.8) counts as due; a woken cell's fresh
        # now + 1 alarm counts as due
        now = clock.now_ms()
        for name, alarm_at in alarms:
            if alarm_at > now + config.MIN_ALARM_DELAY_MS:
                self._tick_at(alarm_at)  # the earliest future alarm before the next interval tick
                break
            budget = self._reserve()
            if budget == 0:
                starving = True  # due work left behind: finishing threads hand their turn to the tick
                break
            claims: list[Claim] = []
            try:
                claims = machine.fire_cell_alarm(
                    name, early_ms=1, skip_locked=True, max_claims=budget, on_locked=self._retry_soon, start=budget
                )
            except Exception:  # noqa: BLE001 - logged with the cell name; the next tick retries
                log.exception("queue cell %s: alarm handler failed", name)
            finally:
                self._hand_out(claims, budget)
            count += len(claims)
        self._starving = starving
        return count

    def _retry_soon(self) -> None:
        """A due cell was locked by another transaction: tick again shortly.

        Every lock holder normally wakes the cell on commit, but an enqueue into
        a cell whose alarm is already due does not (``machine.enqueue_batch``):
        the pending claim phase it counts on may be this very tick.
        """
        with self._lock:
            heapq.heappush(self._timers, time.monotonic() + RETRY_LOCKED_S)

    def _reserve(self, cap: int | None = None) -> int:
        """Reserve the idle delivery threads (at most ``cap``) for a claim; returns how many."""
        with self._lock:
            free = max(0, self.max_workers - self._outstanding)
            if cap is not None:
                free = min(free, cap)
            self._outstanding += free
            return free

    def _hand_out(self, claims: list[Claim], held: int) -> None:
        """Queue ``claims`` on ``held`` reserved threads (``len(claims) ≤ held``) and free the rest."""
        for claim in claims:
            self._jobs.put(claim)
        self._settle(held - len(claims))

    def _settle(self, n: int) -> None:
        """``n`` reserved or running threads are idle again."""
        if n <= 0:
            return
        with self._idle:
            self._outstanding -= n
            if not self._outstanding:
                self._idle.notify_all()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._poke.wait(self._next_wait())
                self._poke.clear()
                if self._stopping.is_set():
                    break
                self._last_tick = time.monotonic()
                try:
                    self._check_connection()
                    self.tick()
                    liveness.touch_pump()  # the console's "pumps" (rate-limited, never raises)
                except Exception as exc:  # noqa: BLE001 - e.g. the database is briefly unavailable
                    log.exception("queue pump: tick failed")
                    if isinstance(exc, DatabaseError):
                        connections["default"].close()
        finally:
            connections.close_all()

    _checked = threading.local()

    def _check_connection(self) -> None:
        """``close_old_connections()`` at most once a second per thread.

        With ``CONN_HEALTH_CHECKS`` each call costs a ``SELECT 1`` round trip
        on the next query; a delivery thread calls it between deliveries only
        to drop an expired or broken connection, which a second's delay (or
        the reconnect after a database error, see ``_work``) covers.
        """
        now = time.monotonic()
        if now - getattr(self._checked, "at", 0.0) >= 1.0:
            self._checked.at = now
            close_old_connections()

    def _next_wait(self) -> float:
        """Seconds until the next tick: the interval, or sooner for a requested one.

        Requests up to the start of the last tick were served by it; a
        request that came due while it ran gets a tick at once.
        """
        now = time.monotonic()
        with self._lock:
            while self._timers and self._timers[0] <= self._last_tick:
                heapq.heappop(self._timers)
            nxt = self._timers[0] - now if self._timers else self.interval_s
        return max(0.0, min(self.interval_s, nxt))

    def _work(self) -> None:
        try:
            while True:
                claim = self._jobs.get()
                if claim is None:
                    break
                held = 1  # this thread; grows by the threads reserved for the next claims
                more: list[Claim] = []

                def claim_budget() -> int:
                    nonlocal held
                    if self._stopping.is_set() or self._starving:
                        return 0  # stopping: claim nothing; starving: let the tick serve waiting cells
                    extra = self._reserve(cap=config.max_inflight())
                    held += extra
                    return 1 + extra

                try:
                    self._check_connection()
                    report, more = delivery.deliver_and_claim_next(
                        claim, should_claim=claim_budget, leases=self.leases
                    )
                    if report is not None and self.log_deliveries and log.isEnabledFor(logging.INFO):
                        log.info("%s", report.log_line())
                except Exception as exc:  # noqa: BLE001 - the claim is recovered after its deadline
                    log.exception("queue cell %s: delivery of %s failed", claim.cell_name, claim.message_id)
                    if isinstance(exc, DatabaseError):
                        connections["default"].close()  # reconnect for the next delivery
                finally:
                    with self._lock:
                        self.delivered += 1
                    self._hand_out(more, held)
        finally:
            connections.close_all()
