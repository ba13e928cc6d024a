"""Dead letters (docs/protocol.md §7.7, §7.9): burying a message, listing, redriving and purging.

A message whose counted failures reach ``QUEUE_MAX_ATTEMPTS`` moves to
``DeadLetter`` under ``dlq:<ms13 failedAt>:<messageId>`` (``_bury``, called by
the retry outcome); an operator lists them (P4 pages), redrives one back to
the queue or purges them all.
"""
from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q

from worldcell import codec

from ..models import DeadLetter, Message, QueueCell
from ..runref import run_of_message
from .lock import _lock_and_wake, arm_alarm_at_most
from .values import DeliveryRow, dlq_key

__all__ = ["list_dead_letters", "purge_dead_letters", "redrive_dead_letter"]


def _bury(cell: QueueCell, row: DeliveryRow, attempt: int, reason: str, status: int | None, now: int) -> None:
    """Store ``row`` as the dead letter ``dlq:<ms13 now>:<id>`` (its message row is already deleted, §7.7).

    The same key overwrites, as upstream.
    """
    key = dlq_key(now, row.message_id)
    DeadLetter.objects.filter(cell=cell, dlq_key=key).delete()
    DeadLetter.objects.create(
        cell=cell, dlq_key=key, message_id=row.message_id, queue_name=row.queue_name,
        pathname=row.pathname, body=codec.encode(row.body), target_base_url=row.target_base_url,
        idempotency_key=row.idempotency_key, attempt=attempt, enqueued_at=row.enqueued_at,
        last_error=reason, last_status=status, deliveries=row.deliveries, failed_at=now,
        run_id=run_of_message(row.queue_name, row.body),
    )


def _holder_and_same(cell: QueueCell, message_id: str, key: str | None) -> tuple[tuple | None, tuple | None]:
    """The live message holding ``key`` and the live message with ``message_id`` (one query; enqueue, redrive)."""
    cond = Q(message_id=message_id)
    if key:
        cond |= Q(idempotency_key=key)
    rows = list(Message.objects.filter(cell=cell).filter(cond).values_list("pk", "message_id", "idempotency_key"))
    holder = next((r for r in rows if key and r[2] == key), None)
    same = next((r for r in rows if r[1] == message_id), None)
    return holder, same


def _fresh_lifecycle(now: int) -> dict[str, Any]:
    """Column values of a message that starts over (enqueue overwrite, redrive)."""
    return dict(
        attempt=0,
        inflight_deadline=None,
        claim_token=None,
        delivery_started_at=None,
        deliveries=0,
        last_error=None,
        last_status=None,
        last_attempt_at=None,
        updated_at=now,
    )


def _dead_letter_wire(d: DeadLetter) -> dict[str, Any]:
    row: dict[str, Any] = {
        "messageId": d.message_id,
        "queueName": d.queue_name,
        "pathname": d.pathname,
        "body": d.body_text,
        "targetBaseUrl": d.target_base_url,
    }
    if d.idempotency_key is not None:
        row["idempotencyKey"] = d.idempotency_key
    row["attempt"] = d.attempt
    row["enqueuedAt"] = d.enqueued_at
    if d.last_error is not None:
        row["lastError"] = d.last_error
    row["failedAt"] = d.failed_at
    return row


def list_dead_letters(cell_name: str, limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
    """A P4 page of dead letters (docs/protocol.md §4.0, §7.9), ordered by ``dlq:`` key.

    ``cursor`` is a full key; rows with a key strictly greater are listed.
    Returns ``{"data":[rows],"cursor":<last key|None>,"hasMore":bool}``; with
    ``limit == 0`` and rows present: ``{"data":[],"hasMore":True}`` (no cursor
    member, as upstream).
    """
    qs = DeadLetter.objects.filter(cell__name=cell_name)
    if cursor is not None:
        qs = qs.filter(dlq_key__gt=cursor)
    fetched = list(qs.order_by("dlq_key")[: limit + 1])
    page = fetched[:limit]
    has_more = len(fetched) > limit
    result: dict[str, Any] = {"data": [_dead_letter_wire(d) for d in page]}
    if not has_more:
        result["cursor"] = None
    elif page:
        result["cursor"] = page[-1].dlq_key
    result["hasMore"] = has_more
    return result


def redrive_dead_letter(cell_name: str, message_id: str, now: int | None = None, *,
                        target_base_url: str | None = None) -> dict[str, bool]:
    """Move the first dead letter (in key order) of ``message_id`` back to the queue (§7.9).

    The message starts over: attempt 0, no last error, ``enqueuedAt`` and
    ``targetBaseUrl`` kept, due now, ``armAlarmAtMost(now)``. Refuses with
    ``{"ok": False}`` (changing nothing) when another live message holds its
    idempotency key, or when there is no such dead letter.

    ``target_base_url``: the console's "redrive to an edited URL" — the
    message goes to this base URL instead (already validated by the caller,
    ``queueing.operations.check_target_url``); the wire method never sets it.
    """
    with transaction.atomic():
        cell, now = _lock_and_wake(cell_name, now)
        if cell is None:
            return {"ok": False}
        dead = DeadLetter.objects.filter(cell=cell, message_id=message_id).order_by("dlq_key").first()
        if dead is None:
            return {"ok": False}
        key = dead.idempotency_key or None
        holder, same = _holder_and_same(cell, message_id, key)
        if holder is not None and holder[1] != message_id:
            return {"ok": False}
        fields = dict(
            queue_name=dead.queue_name,
            pathname=dead.pathname,
            body=dead.body,
            target_base_url=dead.target_base_url if target_base_url is None else target_base_url,
            idempotency_key=dead.idempotency_key,
            enqueued_at=dead.enqueued_at,
            due_at=now,
            run_id=dead.run_id,
            **_fresh_lifecycle(now),
        )
        if same is not None:
            Message.objects.filter(pk=same[0]).update(**fields)
        else:
            Message.objects.create(cell=cell, message_id=message_id, **fields)
        DeadLetter.objects.filter(pk=dead.pk).delete()
        arm_alarm_at_most(cell, now, now)
    return {"ok": True}


def purge_dead_letters(cell_name: str) -> dict[str, int]:
    """Delete every dead letter of the cell in one transaction; ``{"purged": n}`` (§7.9)."""
    with transaction.atomic():
        cell, _ = _lock_and_wake(cell_name, None)
        if cell is None:
            return {"purged": 0}
        purged, _ = DeadLetter.objects.filter(cell=cell).delete()
    return {"purged": purged}
