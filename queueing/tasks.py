"""Celery tasks that drive the queue cells (DESIGN.md "Delivery").

They only *wake* cells; the database decides (DESIGN.md rule 3). Any of
these messages may be lost, duplicated or delayed: a lost delivery leaves its
claim in flight until the deadline, then the next alarm makes it due again; a
duplicated one fails the claim-token compare-and-set and does nothing.

* ``fire_due_alarms`` — beat, every second: fire every cell whose alarm is
  due (``SKIP LOCKED`` on the cell rows; two beats do no harm).
* ``wake_cell(name)`` — sent on commit after an enqueue, a redrive, a freed
  in-flight slot, or as a short ``countdown`` for work due within a minute.
* ``deliver_message(...)`` — POST one claimed message, apply the outcome, and
  refill the freed in-flight slot itself (no broker round trip on a busy cell).

Run the worker with a threads pool sized for ``shards × QUEUE_MAX_INFLIGHT``
plus a few threads for the wake-ups, e.g.
``celery -A worldcell worker --pool threads --concurrency 16`` and one
``celery -A worldcell beat``.
"""
from __future__ import annotations

import logging

from celery import shared_task
from django.db import close_old_connections

from . import delivery, machine, wake
from .machine import Claim

log = logging.getLogger("queueing.tasks")

__all__ = ["deliver_message", "fire_due_alarms", "send_deliveries", "wake_cell"]


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
    """Fire every due queue cell alarm and send the deliveries; returns the number of claims."""
    close_old_connections()
    try:
        return len(machine.fire_due_alarms(dispatch=send_deliveries))
    finally:
        close_old_connections()


@shared_task(name="queueing.tasks.wake_cell", ignore_result=True)
def wake_cell(cell_name: str) -> int:
    """Run cell ``cell_name``'s alarm handler if its alarm is due; returns the number of claims."""
    wake.forget_scheduled(cell_name)
    close_old_connections()
    try:
        return len(machine.fire_cell_alarm(cell_name, early_ms=1, skip_locked=True, dispatch=send_deliveries))
    except Exception:  # noqa: BLE001 - logged with the cell name; beat fires it again
        log.exception("queue cell %s: wake-up failed; the next beat tick fires it again", cell_name)
        return 0
    finally:
        close_old_connections()


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
                report, more = delivery.deliver_and_claim_next(claim, should_claim=lambda: not last)
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
