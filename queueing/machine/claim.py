"""Claims (docs/protocol.md §7.4, §9.1): the alarm handler's claim phase, firing alarms, starting a delivery.

``fire_cell_alarm`` / ``fire_due_alarms`` lock due cells and run
``claim_due_messages``; ``start_delivery`` is the one statement that runs
without the cell lock (a compare-and-set on the claim token).
"""
from __future__ import annotations

import logging
import uuid
from typing import Callable

from django.db import transaction

from worldcell import clock, codec

from .. import config, lease, wake
from ..models import QueueCell
from . import db, sql
from .lock import _lock_cell, _set_alarm, _wake_after_commit, next_alarm
from .values import Claim, DeliveryRow, Dispatch

log = logging.getLogger("queueing.machine")

__all__ = ["cell_alarms", "claim_due_messages", "due_cell_names", "fire_cell_alarm", "fire_due_alarms", "start_delivery"]


# --------------------------------------------------------------------------- alarm handler (§7.4)


def claim_due_messages(
    cell: QueueCell, now: int, limit: int | None = None, *, start: int = 0
) -> tuple[list[Claim], int]:
    """The claim phase of the alarm handler on a locked cell (docs/protocol.md §7.4).

    1. claims whose deadline is ``≤ now`` are lost: their messages become due at ``now``;
    2. if fewer than ``QUEUE_MAX_INFLIGHT`` remain in flight, the earliest due
       messages (``due_at ≤ now``, by due time then message id) are claimed up
       to the free slots: a claim lease, deadline ``lease.first_deadline(now)``
       (docs/leases.md; §7.4 itself says ``now + QUEUE_DELIVERY_TIMEOUT_MS + 30 000``),
       a fresh claim token — never more than ``limit`` when given (a driver
       with that many idle delivery threads; what is left stays due);
    3. ``scheduleNextAlarm(now)`` — computed from what steps 1–2 read: the
       schedule query fetches one row beyond the free slots, which is the
       earliest message left unclaimed.

    The first ``start`` claims have their POST marked begun in the statement
    that claims them (what ``start_delivery`` would do next) and carry the
    row to POST (``Claim.started``): the caller's delivery threads deliver
    them without another statement.

    Must run inside the transaction that locked ``cell``; typically three
    statements (in-flight count and due messages in one read, the claim, the
    alarm). Returns ``(claims, recovered_count)``.
    """
    cap = config.max_inflight() if limit is None else max(0, min(limit, config.max_inflight()))
    inflight, first_deadline, due_rows = _claim_state(cell, cap + 1)
    recovered = 0
    if first_deadline is not None and first_deadline <= now:
        recovered = db.rowcount(sql.RECOVER, [now, now, cell.pk, now])
        inflight, first_deadline, due_rows = _claim_state(cell, cap + 1)
    free = min(cap, max(0, config.max_inflight() - inflight))
    take = [r for r in due_rows[:free] if r[2] <= now]
    claims: list[Claim] = []
    if take:
        token = uuid.uuid4().hex
        deadline = lease.first_deadline(now)  # a claim lease (docs/leases.md)
        claim_set = [deadline, token, now, now, now]  # sql.claim_set's parameters
        begun, rest = take[:start], take[start:]
        if begun:
            ids = [pk for pk, _, _ in begun]
            returned = {
                r[0]: _delivery_row(r[1:]) for r in db.rows(sql.claim_started(len(ids)), [*claim_set, *ids])
            }
            claims += [Claim(cell.name, cell.pk, pk, mid, token, started=returned[pk]) for pk, mid, _ in begun]
        if rest:
            ids = [pk for pk, _, _ in rest]
            db.rowcount(sql.claim_unstarted(len(ids)), [*claim_set, *ids])
            claims += [Claim(cell.name, cell.pk, pk, mid, token) for pk, mid, _ in rest]
        first_deadline = deadline if first_deadline is None else min(first_deadline, deadline)
    next_due = due_rows[len(take)][2] if len(due_rows) > len(take) else None
    _set_alarm(cell, next_alarm(next_due, first_deadline, now))
    return claims, recovered


def _claim_state(cell: QueueCell, due_limit: int) -> tuple[int, int | None, list[tuple[int, str, int]]]:
    """``(claims in flight, earliest deadline, the first due_limit due messages)`` of a cell, one statement.

    Due messages are ``(pk, message_id, due_at)`` by due time then message id
    (sorted here as well: the order of ``UNION ALL`` branches is not promised;
    Python orders strings by code point, which is their UTF-8 byte order).
    """
    inflight, first_deadline = 0, None
    due: list[tuple[int, str, int]] = []
    for kind, a, b, mid in db.rows(sql.CLAIM_STATE, [cell.pk, cell.pk, due_limit]):
        if kind == 0:
            inflight, first_deadline = a, b
        else:
            due.append((a, mid, b))
    due.sort(key=lambda r: (r[2], r[1]))
    return inflight, first_deadline, due


def _cell_state(cell_name: str) -> tuple[int | None, int | None, int | None, int] | None:
    """One unlocked read: ``(alarm_at, first due_at, first deadline, claims in flight)``, or None."""
    rows = db.rows(sql.CELL_STATE, [cell_name])
    return rows[0] if rows else None


def fire_cell_alarm(
    cell_name: str,
    now: int | None = None,
    *,
    early_ms: int = 0,
    skip_locked: bool = False,
    dispatch: Dispatch | None = None,
    max_claims: int | None = None,
    on_locked: Callable[[], None] | None = None,
    start: int = 0,
) -> list[Claim]:
    """Run cell ``cell_name``'s alarm handler if its alarm is due (docs/protocol.md §9.1, §7.4).

    The alarm is due when ``alarm_at ≤ now + early_ms``. Wake-ups pass
    ``early_ms=1``: overdue alarms are re-armed at ``now + 1`` only so that
    celld sees a fresh edge (§7.8); a wake treats that edge as due.

    Steps: (1) one unlocked read skips cells whose alarm is not due (keeping
    a countdown wake-up coming for a near alarm) and cells whose in-flight
    slots are all busy with unexpired claims; (2) one transaction locks the
    cell — with ``skip_locked`` it gives up when another transaction holds
    the lock (every lock holder wakes the cell again on commit) — reads
    ``now`` (unless given), re-checks the alarm and runs
    ``claim_due_messages``; (3) on commit, ``dispatch(claims)`` and a
    countdown wake-up for the next alarm. ``max_claims`` caps the claims
    (the in-process pump passes its idle delivery threads); ``on_locked()``
    is called when ``skip_locked`` gave up on a due cell (the pump then tries
    again a few ms later). The first ``start`` claims come back started
    (``Claim.started``): only for a caller that delivers them in this process.
    Returns the claims (empty when nothing was due or claimable).
    """
    fixed_now = now
    state = _cell_state(cell_name)
    # the clock is read after the read: an alarm that an enqueue re-armed to
    # its own now + 1 just before (§7.8) is then never "in the future" here
    now = clock.now_ms() if now is None else now
    if state is None:
        return []
    alarm_at, first_due, first_deadline, inflight = state
    if alarm_at is None or alarm_at > now + early_ms:
        wake.after_fire(cell_name, alarm_at, now)  # woken early: keep the next wake-up coming
        return []
    if (
        first_due is not None
        and first_due <= now
        and inflight >= config.max_inflight()
        and (first_deadline is None or first_deadline > now)
    ):
        # every in-flight slot is busy (upstream polls each millisecond here,
        # §7.4); the outcome that frees a slot refills it (§12 A14)
        return []
    with transaction.atomic():
        cell = _lock_cell(cell_name, skip_locked=skip_locked)
        if cell is None:
            if on_locked is not None:
                on_locked()
            return []
        now = clock.now_ms() if fixed_now is None else fixed_now
        if cell.alarm_at is None or cell.alarm_at > now + early_ms:
            _wake_after_commit(cell, now)
            return []
        claims, recovered = claim_due_messages(cell, now, max_claims, start=start)
        if recovered:
            log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell_name, recovered)
        if claims and dispatch is not None:
            transaction.on_commit(lambda: dispatch(claims), robust=True)
        name, new_alarm = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_fire(name, new_alarm, now), robust=True)
    return claims


def due_cell_names(at: int, *, limit: int = 10_000) -> list[str]:
    """Names of the cells whose alarm is ``≤ at``, longest-waiting (earliest alarm) first; one index scan."""
    return [name for name, _ in cell_alarms(at, limit=limit)]



def cell_alarms(at: int, *, limit: int = 10_000) -> list[tuple[str, int]]:
    """``(name, alarm_at)`` of the cells whose alarm is ``≤ at``, earliest alarm first; one index scan."""
    return db.rows(sql.CELL_ALARMS, [at, limit])  # type: ignore[return-value]


def fire_due_alarms(now: int | None = None, *, dispatch: Dispatch | None = None, limit: int = 10_000) -> list[Claim]:
    """Fire every queue cell whose alarm is due (the beat task and the pump tick).

    Steps: (1) one index scan lists the cells with ``alarm_at ≤ now``;
    (2) each is fired in its own transaction with ``SKIP LOCKED`` on its row,
    so overlapping ticks or two beats never wait on each other and never
    claim the same message; (3) ``dispatch(claims)`` runs after each cell's
    commit. A failing cell is logged with its name and does not stop the
    others; its alarm stays due, so the next tick tries again.
    ``now`` defaults to the clock, read again for each cell. Returns all claims.
    """
    fixed_now = now
    names = due_cell_names(clock.now_ms() if now is None else now, limit=limit)
    claims: list[Claim] = []
    for name in names:
        try:
            claims += fire_cell_alarm(name, fixed_now, skip_locked=True, dispatch=dispatch)
        except Exception:  # noqa: BLE001 - one broken cell must not stop the others
            log.exception("queue cell %s: alarm handler failed; it stays due and is retried next tick", name)
    return claims


def start_delivery(claim: Claim, now: int | None = None) -> DeliveryRow | None:
    """Mark the POST of ``claim`` as begun and return the message to POST, or None.

    A single compare-and-set statement (``UPDATE … RETURNING``): it succeeds
    only while the message still carries this claim token, the POST of this
    claim has not begun yet and the claim's deadline has not passed. None
    means "skip": a duplicated or late delivery task, or a claim that was
    already recovered. Records ``last_attempt_at`` and counts the POST in
    ``deliveries``.

    The claim's lease restarts here (``lease.first_deadline(now)``; the
    delivering process renews it while the POST runs, docs/leases.md). Time
    a claim spends waiting for a delivery thread (a busy Celery pool, the
    broker) therefore never eats into the time its POST may take. The
    cell's alarm may still name the claim-time deadline; firing then finds
    nothing lost and moves the alarm to the new one.
    """
    now = clock.now_ms() if now is None else now
    deadline = lease.first_deadline(now)  # a claim lease (docs/leases.md)
    rows = db.rows(sql.START, [now, now, now, deadline, claim.message_pk, claim.token, now])
    return _delivery_row(rows[0]) if rows else None


def _delivery_row(row: tuple) -> DeliveryRow:
    mid, qname, pathname, body, base, key, attempt, enqueued_at, deliveries = row
    return DeliveryRow(mid, qname, pathname, codec.decode(body), base, key, attempt, enqueued_at, deliveries)

