"""Waking a queue cell's driver: this process's pump if it runs one, else Celery (``WORLDCELL_USE_CELERY``).

The database decides what is due (docs/architecture.md rule 3); a wake-up only asks
"run this cell's alarm handler now (or at ``at_ms``)". Losing, duplicating or
delaying a wake-up can delay a delivery, never lose or repeat one: beat (every
second) or the pump's tick (every 25 ms) fires every due alarm anyway.

* ``wake_cell(name, at_ms=None)`` — the one function the rest of the code calls.
* ``after_transition`` / ``after_fire`` — what the state machine registers with
  ``transaction.on_commit`` after a transition: an immediate wake when work is
  due now (enqueue, redrive, rearm, any transaction that held the cell's
  lock while work was due), a timed wake for work due within
  ``COUNTDOWN_WAKE_MAX_MS`` (retry backoffs, short delays), nothing for later
  work (beat covers it; the due time lives in the database). A delivery
  refills its own freed in-flight slot in its outcome transaction, so a busy
  cell needs no wake-ups at all.

**No ETA tasks.** A timed wake sent through Celery is an *immediate*
``wake_cell(name, at_ms)`` task: the worker that runs it asks its pump for a
tick at ``at_ms`` and acks it at once. A Celery ``countdown`` would instead sit
unacknowledged in the worker until it is due — tasks that Redis hands out
again after its visibility timeout, that a broker restart loses, and that made
Celery 5.7.0 workers exit on broker loss (docs/operations-faults.md). A lost
timed wake costs at most one beat second. Sends go through
``queueing.outbox`` (one sender thread, never retried): with the broker down
an enqueue answers at once and the worker's own pump (and beat, once the
broker is back) fires the cell.
* ``register_pump`` / ``current_pump`` — the process's ``LocalPump``, if any.
* ``register_broker(send)`` — the Celery driver's sender of wake-up tasks,
  registered at app start (``QueueingConfig.ready``), so that the queue never
  imports its own driver (``queueing.tasks`` imports the state machine, which
  imports this module).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from django.conf import settings

from worldcell import clock

from . import config

log = logging.getLogger("queueing.wake")

__all__ = [
    "COUNTDOWN_WAKE_MAX_MS",
    "after_fire",
    "after_transition",
    "current_pump",
    "forget_scheduled",
    "register_broker",
    "register_pump",
    "unregister_pump",
    "wake_cell",
]

#: Work due within this many ms gets a timed wake-up (``wake_cell(name, at_ms)``);
#: later work is left to beat and the pumps' interval ticks.
COUNTDOWN_WAKE_MAX_MS = 60_000


class Pump(Protocol):
    def wake(self, cell_name: str | None = None, at_ms: int | None = None) -> None: ...


#: ``send(cell_name, at_ms)``: have a Celery worker's pump run the cell now (``at_ms`` None) or at
#: ``at_ms`` — an immediate ``queueing.tasks.wake_cell`` task, handed to ``queueing.outbox``.
BrokerSend = Callable[[str, "int | None"], None]

_pump: Pump | None = None
_broker_send: BrokerSend | None = None
_pump_lock = threading.Lock()
# cell name -> epoch ms of the timed wake this process already sent
_scheduled: dict[str, int] = {}
_scheduled_lock = threading.Lock()


def register_pump(pump: Pump) -> None:
    """Make ``pump`` the receiver of this process's wake-ups (when Celery is off)."""
    global _pump
    with _pump_lock:
        _pump = pump


def register_broker(send: BrokerSend) -> None:
    """Make ``send`` the way wake-ups reach Celery workers (``WORLDCELL_USE_CELERY``; see ``queueing.tasks``)."""
    global _broker_send
    _broker_send = send


def unregister_pump(pump: Pump) -> None:
    """Forget ``pump`` if it is the registered one."""
    global _pump
    with _pump_lock:
        if _pump is pump:
            _pump = None


def current_pump() -> Pump | None:
    """The registered pump, or None."""
    return _pump


def wake_cell(name: str, at_ms: int | None = None, now: int | None = None) -> None:
    """Ask the driver to run cell ``name``'s alarm handler now, or at ``at_ms`` (epoch ms).

    A process that runs a pump (the dev fleet, or a Celery worker, whose
    ``wake_cell`` tasks drive its pump) pokes it directly — now, or at
    ``at_ms`` — without a round trip through the broker. Elsewhere, with
    Celery: sends ``queueing.tasks.wake_cell(name, at_ms)`` for immediate
    execution (no countdown; a timed wake this process already sent for an
    earlier or equal time is not repeated, because that wake re-schedules the
    next one). Never raises: a failed send is logged with the cell name.
    """
    now = clock.now_ms() if now is None else now
    delay_ms = 0 if at_ms is None else max(0, at_ms - now)
    try:
        pump = _pump
        if pump is not None:
            pump.wake(name, None if delay_ms <= config.MIN_ALARM_DELAY_MS else now + delay_ms)
        elif settings.WORLDCELL_USE_CELERY:
            _send_celery_wake(name, delay_ms, now)
    except Exception:  # noqa: BLE001 - a lost wake only delays delivery until the next tick
        log.exception("queue cell %s: could not send a wake-up; the next beat tick will fire it", name)


def _send_celery_wake(name: str, delay_ms: int, now: int) -> None:
    send = _broker_send
    if send is None:
        raise RuntimeError("WORLDCELL_USE_CELERY is on but no Celery driver registered (queueing.apps)")
    at: int | None = None
    if delay_ms > config.MIN_ALARM_DELAY_MS:
        at = now + delay_ms
        with _scheduled_lock:
            pending = _scheduled.get(name)
            if pending is not None and now < pending <= at:
                return
            _scheduled[name] = at
            if len(_scheduled) > 10_000:
                for key in [k for k, v in _scheduled.items() if v <= now]:
                    del _scheduled[key]
    # run at once (no countdown: the worker holds no unacked ETA task), sent off the request path
    send(name, at)


def forget_scheduled(name: str) -> None:
    """Called when a wake-up of cell ``name`` runs: this process no longer has one pending."""
    with _scheduled_lock:
        _scheduled.pop(name, None)


def after_transition(name: str, alarm_at: int | None, now: int) -> None:
    """On commit of a transition: wake the cell if its alarm says work is due soon.

    ``alarm_at ≤ now + 1`` (work due now) -> immediate wake; within
    ``COUNTDOWN_WAKE_MAX_MS`` -> a timed wake; else nothing.
    """
    if alarm_at is None:
        return
    delay = alarm_at - now
    if delay <= config.MIN_ALARM_DELAY_MS:
        wake_cell(name, None, now)
    elif delay <= COUNTDOWN_WAKE_MAX_MS:
        wake_cell(name, alarm_at, now)


def after_fire(name: str, alarm_at: int | None, now: int) -> None:
    """On commit of a claim phase: keep a timed wake for the next future alarm.

    No immediate wake here: an alarm at ``now + 1`` after a claim means every
    in-flight slot is busy (§7.4), and the outcome that frees a slot wakes the
    cell itself — waking now would only spin.
    """
    if alarm_at is None:
        return
    delay = alarm_at - now
    if config.MIN_ALARM_DELAY_MS < delay <= COUNTDOWN_WAKE_MAX_MS:
        wake_cell(name, alarm_at, now)
