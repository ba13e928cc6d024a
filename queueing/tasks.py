"""Celery tasks that drive the queue cells (docs/architecture.md "Delivery").

They only *wake* cells; the database decides (docs/architecture.md rule 3). Any of
these messages may be lost, duplicated or delayed: a lost wake-up delays a
delivery until the next beat tick, a duplicated one finds nothing to do.

* ``fire_due_alarms`` — beat, every second: fire every cell whose alarm is
  due (``SKIP LOCKED`` on the cell rows; two beats do no harm).
* ``wake_cell(name, at_ms=None)`` — sent on commit after an enqueue into a
  cell with a free in-flight slot, a redrive, a rearm, or — with ``at_ms`` —
  for work due within a minute; always run at once (never a ``countdown``:
  the pump keeps the timed tick, so the worker holds no unacked ETA task).
* ``deliver_message(...)`` — POST one claimed message and keep its slot busy
  (kept for claims dispatched as tasks, e.g. by an older release).

**The worker delivers with a pump.** Both wake-up tasks only poke the
worker process's ``LocalPump`` (``worker_pump()``, started on first use): its
tick thread fires the due cells and its delivery threads POST the claims,
each refilling its own freed slot in the outcome transaction — exactly what
the dev fleet does. So no claim travels through the broker, a delivery
thread keeps its database connection (Celery closes a task thread's
connection after every task, and reconnecting costs more than a delivery),
and the broker carries one small message per wake-up only. Wake-ups that
the worker's own transitions need (a retry's backoff, a freed slot) go to
its pump directly (``wake.wake_cell``). The pump renews the leases of the
claims it delivers (docs/leases.md); a claim it holds when the worker dies is
recovered once its lease lapses (``QUEUE_CLAIM_LEASE_MS``, 10 s), like any
lost claim.

**Broker outages.** The pump ticks on its own every ``QUEUE_WORKER_TICK_MS``
(default 1000) and needs only the database, so a worker keeps
delivering — and delivers what API processes enqueue meanwhile within about a
second — while the broker is down; Celery reconnects forever
(``CELERY_BROKER_CONNECTION_MAX_RETRIES = None``) and the worker holds no
unacked ETA tasks that a reconnect could lose (docs/operations-faults.md).

``QUEUE_WORKER_DELIVERY_THREADS`` (default 16) sizes the pump: size it for
shards × ``QUEUE_MAX_INFLIGHT``; the pump never claims more than it has idle
threads, so a smaller pool delays deliveries but never strands a claim. The
Celery pool itself only runs the short wake-up tasks:
``celery -A worldcell worker --pool threads --concurrency 4`` and one
``celery -A worldcell beat``.
"""
from __future__ import annotations

import logging
import os
import threading

from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings
from django.db import close_old_connections

from . import config, delivery, wake
from .machine import Claim
from .outbox import outbox
from .pump import LocalPump

log = logging.getLogger("queueing.tasks")

__all__ = [
    "deliver_message", "fire_due_alarms", "publish_wake", "send_deliveries", "send_wake", "wake_cell", "worker_pump",
]

#: Default seconds between the worker pump's own ticks (``QUEUE_WORKER_TICK_MS``).
WORKER_PUMP_INTERVAL_S = 1.0
#: On a warm shutdown, how long the pump may finish deliveries in progress.
WORKER_PUMP_DRAIN_S = 10.0

_pump: LocalPump | None = None
_pump_pid: int | None = None
_pump_lock = threading.Lock()


def worker_pump() -> LocalPump:
    """This worker process's delivery pump, started on first use (and again after a fork)."""
    global _pump, _pump_pid
    if _pump is None or _pump_pid != os.getpid():
        with _pump_lock:
            if _pump is None or _pump_pid != os.getpid():
                threads = int(getattr(settings, "QUEUE_WORKER_DELIVERY_THREADS", 16) or 16)
                interval_s = config.positive_int_setting("QUEUE_WORKER_TICK_MS", int(WORKER_PUMP_INTERVAL_S * 1000)) / 1000
                _pump = LocalPump(interval_s=interval_s, max_workers=threads, log_deliveries=True)
                _pump.start()
                _pump_pid = os.getpid()
    return _pump


@worker_shutting_down.connect
def _stop_worker_pump(**kwargs) -> None:
    pump = _pump
    if pump is not None and _pump_pid == os.getpid():
        left = pump.stop(WORKER_PUMP_DRAIN_S)
        if left:
            log.warning("queue pump stopped with %d delivery(ies) unfinished; redelivered after their deadline", left)


def send_deliveries(claims: list[Claim]) -> None:
    """Send one ``deliver_message`` task per claim (called on commit of the claim).

    A failed send is logged; that claim is recovered after its deadline.
    """
    for claim in claims:
        try:
            deliver_message.apply_async(claim.as_task_args())
        except Exception:  # noqa: BLE001 - the claim's deadline recovers it
            log.exception(
                "queue cell %s: could not send the delivery of %s; it is redelivered after its claim deadline",
                claim.cell_name, claim.message_id,
            )


@shared_task(name="queueing.tasks.fire_due_alarms", ignore_result=True)
def fire_due_alarms() -> int:
    """Beat: have this worker's pump fire every due queue cell now (``LocalPump.tick``).

    Also records beat's tick for readiness (``worldcell.health.record_beat``, one UPDATE).
    """
    worker_pump().wake()
    from worldcell.health import record_beat

    record_beat()
    return 0


@shared_task(name="queueing.tasks.wake_cell", ignore_result=True)
def wake_cell(cell_name: str, at_ms: int | None = None) -> int:
    """Have this worker's pump run cell ``cell_name``'s alarm handler now, or at epoch ms ``at_ms``.

    Sent for immediate execution even when ``at_ms`` is in the future: the
    pump keeps the timed tick, so the worker never holds an unacked ETA task
    (``queueing.wake``). A tick at ``at_ms`` lost with this worker costs at
    most one beat second.
    """
    wake.forget_scheduled(cell_name)
    worker_pump().wake(cell_name, None if at_ms is None else int(at_ms))
    return 0


#: An immediate wake-up task older than this is useless (beat has run since).
WAKE_EXPIRES_S = 30.0


def publish_wake(cell_name: str, at_ms: int | None) -> None:
    """Send one ``wake_cell(cell_name, at_ms)`` task for immediate execution, never retried (raises if the broker is down)."""
    wake_cell.apply_async((cell_name, at_ms), expires=WAKE_EXPIRES_S, retry=False)


def send_wake(cell_name: str, at_ms: int | None) -> None:
    """Queue a wake-up for this process's sender thread (``queueing.outbox``); never blocks, never raises.

    Registered with ``queueing.wake`` at app start (``QueueingConfig.ready``).
    """
    outbox(publish_wake).put(cell_name, at_ms)


#: Deliveries one ``deliver_message`` task makes in a row while it keeps refilling its own slot.
MAX_DELIVERIES_PER_TASK = 100


@shared_task(name="queueing.tasks.deliver_message", ignore_result=True)
def deliver_message(cell_name: str, cell_id: int, message_pk: int, message_id: str, token: str) -> int:
    """POST one claimed message and apply the outcome, then keep the freed slot busy.

    After each outcome the task fires the cell itself (``deliver_and_claim_next``):
    the first new claim — already marked begun in that transaction — is
    delivered by this same task, the others are sent as new tasks. The last
    of ``MAX_DELIVERIES_PER_TASK`` deliveries claims nothing (its outcome
    wakes the cell instead), so a begun claim never leaves this task.
    Returns the number of deliveries made.
    """
    claim: Claim | None = Claim.from_task_args([cell_name, cell_id, message_pk, message_id, token])
    made = 0
    close_old_connections()
    try:
        while claim is not None:
            last = made + 1 >= MAX_DELIVERIES_PER_TASK
            try:
                report, more = delivery.deliver_and_claim_next(
                    claim, should_claim=lambda: not last, leases=worker_pump().leases
                )
            except Exception:  # noqa: BLE001 - the claim stays in flight and is recovered after its deadline
                log.exception("queue cell %s: delivery of %s failed", claim.cell_name, claim.message_id)
                return made
            if report is not None:
                made += 1
                if log.isEnabledFor(logging.INFO):
                    log.info("%s", report.log_line())
            send_deliveries(more[1:])
            claim = more[0] if more else None
        return made
    finally:
        close_old_connections()


@worker_ready.connect
def _serve_worker_metrics(**kwargs) -> None:
    """Serve this worker's delivery metrics on ``WORLDCELL_WORKER_METRICS_PORT`` (docs/operations.md "Metrics")."""
    from worldcell import metrics

    metrics.serve_worker_metrics()
