"""The queue state machine: every transition of a queue cell, in one file (PROTOCOL.md §7).

A message lives in ``Message`` from enqueue until it is acked, dropped or
dead-lettered::

    enqueue ──> pending (due_at) ──claim──> in flight (inflight_deadline, claim_token)
                   ^    ^                        │
                   │    └── 503 {timeoutSeconds} ┤  (not counted, key kept)
                   │    └── counted retry ───────┤  attempt+1, backoff min(60, 2^attempt) s
                   │    └── deadline passed ─────┤  (lost claim recovered by the next alarm)
                   │                             ├── 2xx ─────────────> acked (row deleted)
                   │                             ├── 404/409/410/422 ─> dropped (row deleted)
                   └── redrive <── DeadLetter <──┘  attempt reaches QUEUE_MAX_ATTEMPTS

Rules every function here follows:

* each transition is ONE short transaction that first locks the cell's
  ``QueueCell`` row (``SELECT … FOR UPDATE``; on SQLite the IMMEDIATE
  transaction is the lock), reads ``now`` once and ends with the alarm helper
  the spec names (§7.8);
* outcomes of a delivery are applied only while the claim token still
  matches (compare-and-set), so a late or duplicated delivery task can never
  apply an outcome twice or touch a newer claim;
* nothing here does network I/O; wake-ups of the driver (Celery or the
  in-process pump) are registered with ``transaction.on_commit`` so they
  happen only once the transition is durable (DESIGN.md rules 3 and 6);
* every transaction that held a cell's lock wakes the cell on commit when
  work is due, so a wake-up that finds the cell locked may simply skip it
  (``SKIP LOCKED``) — the lock holder will wake it again;
* a delivery's outcome transaction may run the claim phase itself
  (``claim_next``) so a freed in-flight slot is refilled at once (§12 A14);
  while every slot is busy, alarm firings are skipped instead of polling.

The one statement that runs without the cell lock is ``start_delivery``: a
single-row compare-and-set (``UPDATE … RETURNING``) that marks "the POST of
this claim has begun" so a duplicated delivery task cannot POST the same
claim twice.
"""
from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Min, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce

from worldcell import clock, codec

from . import config, wake
from .models import DeadLetter, Message, QueueCell

log = logging.getLogger("queueing.machine")

__all__ = [
    "Claim",
    "DeliveryRow",
    "EnqueueRequest",
    "RearmReport",
    "ack_message",
    "apply_outcome",
    "arm_alarm_at_most",
    "backoff_seconds",
    "cell_stats",
    "claim_due_messages",
    "dlq_key",
    "drop_message",
    "due_cell_names",
    "enqueue",
    "fire_cell_alarm",
    "fire_due_alarms",
    "list_dead_letters",
    "ms13",
    "purge_dead_letters",
    "rearm_alarm",
    "rearm_cell",
    "redeliver_later",
    "redrive_dead_letter",
    "retry_message",
    "schedule_next_alarm",
    "start_delivery",
]

Dispatch = Callable[[list["Claim"]], None]


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated ``enqueue`` request (PROTOCOL.md §7.3); times in seconds as sent."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    queue_shards: int
    idempotency_key: str | None = None
    delay_seconds: float | None = None


@dataclass(frozen=True)
class Claim:
    """One claimed message, handed from the claim transaction to a delivery.

    ``token`` identifies this claim; outcomes apply only while the message
    still carries it. ``as_task_args()`` / ``from_task_args()`` turn it into
    plain values for a Celery task.
    """

    cell_name: str
    cell_id: int
    message_pk: int
    message_id: str
    token: str

    def as_task_args(self) -> list[Any]:
        return [self.cell_name, self.cell_id, self.message_pk, self.message_id, self.token]

    @classmethod
    def from_task_args(cls, args: Iterable[Any]) -> "Claim":
        cell_name, cell_id, message_pk, message_id, token = args
        return cls(cell_name, int(cell_id), int(message_pk), message_id, token)


@dataclass(frozen=True)
class DeliveryRow:
    """The message as it was when its claim's delivery began (the "row" of §7.5–7.7)."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    idempotency_key: str | None
    attempt: int
    enqueued_at: int
    deliveries: int


@dataclass(frozen=True)
class RearmReport:
    """What ``rearm_cell`` found and changed on one cell (``manage.py rearm_alarms``)."""

    name: str
    pending: int
    inflight: int
    dead_letters: int
    alarm_before: int | None
    alarm_after: int | None
    recovered: int


# --------------------------------------------------------------------------- keys and times


def clamp_ms(ms: float) -> int:
    """Floor ``ms`` into ``[0, MAX_EPOCH_MS]`` (the ``ms13`` rule of §7.1, plus an upper bound).

    Total over floats: NaN and ``-inf`` (e.g. a 503 ``timeoutSeconds`` of
    ``-1e308`` times 1000) give 0 — "due now" — and ``+inf`` gives the bound.
    """
    if ms != ms or ms <= 0:  # NaN, negative (incl. -inf)
        return 0
    if ms >= config.MAX_EPOCH_MS:  # incl. +inf
        return config.MAX_EPOCH_MS
    return math.floor(ms)


def ms13(ms: float) -> str:
    """Epoch ms as the 13-digit key fragment of §7.1 (``max(0, floor(ms))``, zero-padded)."""
    return str(clamp_ms(ms)).zfill(13)


def dlq_key(failed_at: int, message_id: str) -> str:
    """The dead-letter key ``dlq:<ms13 failedAt>:<messageId>`` (also the P4 cursor, §4.0)."""
    return f"dlq:{ms13(failed_at)}:{message_id}"


def backoff_seconds(attempt: int) -> int:
    """Delay before the next try after ``attempt`` counted failures: ``min(60, 2^attempt)`` s (§7.7)."""
    return 60 if attempt >= 6 else 2**attempt


# --------------------------------------------------------------------------- cell lock


def _lock_cell(name: str, *, create: bool = False, skip_locked: bool = False) -> QueueCell | None:
    """Lock and return the cell row named ``name`` inside the current transaction.

    ``create=True`` inserts it when missing (a savepoint absorbs the insert
    race with a concurrent creator). Returns None when the cell does not exist
    (and ``create`` is false) or, with ``skip_locked``, when another
    transaction holds it.
    """
    qs = QueueCell.objects.select_for_update(skip_locked=skip_locked).filter(name=name)
    cell = qs.first()
    if cell is not None or not create:
        return cell
    try:
        with transaction.atomic():
            return QueueCell.objects.create(name=name)
    except IntegrityError:
        return QueueCell.objects.select_for_update().get(name=name)


def _set_alarm(cell: QueueCell, alarm_at: int | None) -> None:
    if cell.alarm_at != alarm_at:
        QueueCell.objects.filter(pk=cell.pk).update(alarm_at=alarm_at)
        cell.alarm_at = alarm_at


# --------------------------------------------------------------------------- alarm helpers (§7.8)


def arm_alarm_at_most(cell: QueueCell, target: int, now: int) -> None:
    """Arm the cell's alarm no later than ``target`` (enqueue, redrive; PROTOCOL.md §7.8).

    An alarm that is already overdue (``≤ now``) moves to ``now + 1``;
    otherwise the alarm becomes ``max(target, now + 1)`` if that is earlier
    than the current one (or there is none). Writes only when it changes.
    """
    current = cell.alarm_at
    if current is not None and current <= now:
        _set_alarm(cell, now + config.MIN_ALARM_DELAY_MS)
        return
    t = now + config.MIN_ALARM_DELAY_MS if target <= now else target
    if current is None or t < current:
        _set_alarm(cell, t)


def schedule_next_alarm(cell: QueueCell, now: int) -> int | None:
    """Set the alarm to the earliest due time or in-flight deadline (PROTOCOL.md §7.8).

    Overdue work gives ``now + 1``; no work at all clears the alarm.
    Returns the new alarm (epoch ms or None). One query + a write if changed.
    """
    msgs = Message.objects.filter(cell_id=OuterRef("pk"))
    first_due = msgs.filter(due_at__isnull=False).order_by("due_at").values("due_at")[:1]
    first_deadline = (
        msgs.filter(inflight_deadline__isnull=False).order_by("inflight_deadline").values("inflight_deadline")[:1]
    )
    due, deadline = (
        QueueCell.objects.filter(pk=cell.pk)
        .annotate(d=Subquery(first_due), f=Subquery(first_deadline))
        .values_list("d", "f")
        .get()
    )
    _set_alarm(cell, _next_alarm(due, deadline, now))
    return cell.alarm_at


def _next_alarm(first_due: int | None, first_deadline: int | None, now: int) -> int | None:
    """The alarm ``scheduleNextAlarm`` sets: earliest of the two, ``now + 1`` if overdue, None if neither."""
    candidates = [t for t in (first_due, first_deadline) if t is not None]
    if not candidates:
        return None
    nxt = min(candidates)
    return now + config.MIN_ALARM_DELAY_MS if nxt <= now else nxt


def _wake_after_commit(cell: QueueCell, now: int) -> None:
    """Register the driver wake-up for when this transaction commits (DESIGN.md rule 6).

    Every transaction that locks a cell registers it, whatever its outcome,
    with the alarm as it stands at commit: a wake-up that found the cell
    locked (and skipped it) relies on the lock holder to wake the cell again.
    """
    transaction.on_commit(lambda: wake.after_transition(cell.name, cell.alarm_at, now), robust=True)


# --------------------------------------------------------------------------- enqueue (§7.3)


def _config_mismatch(pinned: int, got: int) -> dict[str, Any]:
    return {
        "ok": False,
        "code": "CONFIG_MISMATCH",
        "message": (
            f"queue cell shard-count mismatch: pinned {pinned}, got {got} "
            "\u2014 changing queueShards requires draining the fleet"
        ),
    }


def _holder_and_same(cell: QueueCell, message_id: str, key: str | None) -> tuple[tuple | None, tuple | None]:
    """The live message holding ``key`` and the live message with ``message_id`` (one query)."""
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


def enqueue(cell_name: str, request: EnqueueRequest, now: int | None = None) -> dict[str, Any]:
    """Store one message in cell ``cell_name`` (PROTOCOL.md §7.3), one transaction.

    Order: pin ``queueShards`` on the first enqueue, else compare (mismatch ->
    ``{"ok":False,"code":"CONFIG_MISMATCH",…}``, checked before dedup); while
    a live message holds ``idempotency_key`` return it with ``deduped: True``
    (after ``scheduleNextAlarm``); else store the message due at
    ``now + max(0, delaySeconds) × 1000`` ms and ``armAlarmAtMost`` it.
    Re-enqueueing a live ``messageId`` without dedup overwrites it (attempt
    reset; an in-flight claim of it is voided — upstream's quirk of possible
    double delivery). Returns ``{"ok":True,"messageId":…,"deduped":bool}``.
    """
    key = request.idempotency_key or None
    with transaction.atomic():
        cell = _lock_cell(cell_name, create=True)
        now = clock.now_ms() if now is None else now
        _wake_after_commit(cell, now)
        if cell.queue_shards is None:
            QueueCell.objects.filter(pk=cell.pk).update(queue_shards=request.queue_shards, pinned_at=now)
            cell.queue_shards, cell.pinned_at = request.queue_shards, now
        elif cell.queue_shards != request.queue_shards:
            return _config_mismatch(cell.queue_shards, request.queue_shards)

        holder, same = _holder_and_same(cell, request.message_id, key)
        if holder is not None:
            schedule_next_alarm(cell, now)
            return {"ok": True, "messageId": holder[1], "deduped": True}

        delay = request.delay_seconds or 0
        due_at = clamp_ms(now + max(0, delay) * 1000)
        fields = dict(
            queue_name=request.queue_name,
            pathname=request.pathname,
            body=codec.encode(request.body),
            target_base_url=request.target_base_url,
            idempotency_key=request.idempotency_key,
            enqueued_at=now,
            due_at=due_at,
            **_fresh_lifecycle(now),
        )
        if same is not None:
            Message.objects.filter(pk=same[0]).update(**fields)
        else:
            Message.objects.create(cell=cell, message_id=request.message_id, **fields)
        arm_alarm_at_most(cell, due_at, now)
    return {"ok": True, "messageId": request.message_id, "deduped": False}


# --------------------------------------------------------------------------- alarm handler (§7.4)


def _inflight_state(cell: QueueCell) -> tuple[int, int | None]:
    """``(claims in flight, earliest deadline)`` of a locked cell (one query)."""
    agg = Message.objects.filter(cell=cell, inflight_deadline__isnull=False).aggregate(
        n=Count("pk"), first=Min("inflight_deadline")
    )
    return agg["n"], agg["first"]


def _recover_lost_claims(cell: QueueCell, now: int) -> int:
    """Claims whose deadline is ``≤ now`` are lost: their messages become due at ``now`` (§7.4 step 1)."""
    return Message.objects.filter(cell=cell, inflight_deadline__lte=now).update(
        due_at=now, inflight_deadline=None, claim_token=None, delivery_started_at=None, updated_at=now
    )


def claim_due_messages(cell: QueueCell, now: int, limit: int | None = None) -> tuple[list[Claim], int]:
    """The claim phase of the alarm handler on a locked cell (PROTOCOL.md §7.4).

    1. claims whose deadline is ``≤ now`` are lost: their messages become due at ``now``;
    2. if fewer than ``QUEUE_MAX_INFLIGHT`` remain in flight, the earliest due
       messages (``due_at ≤ now``, by due time then message id) are claimed up
       to the free slots: deadline ``now + QUEUE_DELIVERY_TIMEOUT_MS + 30 000``,
       a fresh claim token — never more than ``limit`` when given (a driver
       with that many idle delivery threads; what is left stays due);
    3. ``scheduleNextAlarm(now)`` — computed from what steps 1–2 read: the
       schedule query fetches one row beyond the free slots, which is the
       earliest message left unclaimed.

    Must run inside the transaction that locked ``cell``; typically 3–4
    statements. Returns ``(claims, recovered_count)``.
    """
    inflight, first_deadline = _inflight_state(cell)
    recovered = 0
    if first_deadline is not None and first_deadline <= now:
        recovered = _recover_lost_claims(cell, now)
        inflight, first_deadline = _inflight_state(cell)
    free = max(0, config.max_inflight() - inflight)
    if limit is not None:
        free = min(free, max(0, limit))
    rows = list(
        Message.objects.filter(cell=cell, due_at__isnull=False)
        .order_by("due_at", "message_id")
        .values_list("pk", "message_id", "due_at")[: free + 1]
    )
    take = [r for r in rows[:free] if r[2] <= now]
    claims: list[Claim] = []
    if take:
        token = uuid.uuid4().hex
        deadline = clamp_ms(now + config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS)
        Message.objects.filter(pk__in=[pk for pk, _, _ in take]).update(
            due_at=None, inflight_deadline=deadline, claim_token=token, delivery_started_at=None, updated_at=now
        )
        claims = [Claim(cell.name, cell.pk, pk, mid, token) for pk, mid, _ in take]
        first_deadline = deadline if first_deadline is None else min(first_deadline, deadline)
    next_due = rows[len(take)][2] if len(rows) > len(take) else None
    _set_alarm(cell, _next_alarm(next_due, first_deadline, now))
    return claims, recovered


def _cell_state(cell_name: str) -> tuple[int | None, int | None, int | None, int] | None:
    """One unlocked read: ``(alarm_at, first due_at, first deadline, claims in flight)``, or None."""
    msgs = Message.objects.filter(cell_id=OuterRef("pk"))
    return (
        QueueCell.objects.filter(name=cell_name)
        .annotate(
            first_due=Subquery(msgs.filter(due_at__isnull=False).order_by("due_at").values("due_at")[:1]),
            first_deadline=Subquery(
                msgs.filter(inflight_deadline__isnull=False)
                .order_by("inflight_deadline")
                .values("inflight_deadline")[:1]
            ),
            inflight=_count(msgs.filter(inflight_deadline__isnull=False)),
        )
        .values_list("alarm_at", "first_due", "first_deadline", "inflight")
        .first()
    )


def fire_cell_alarm(
    cell_name: str,
    now: int | None = None,
    *,
    early_ms: int = 0,
    skip_locked: bool = False,
    dispatch: Dispatch | None = None,
    max_claims: int | None = None,
) -> list[Claim]:
    """Run cell ``cell_name``'s alarm handler if its alarm is due (PROTOCOL.md §9.1, §7.4).

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
    (the in-process pump passes its idle delivery threads).
    Returns the claims (empty when nothing was due or claimable).
    """
    fixed_now = now
    now = clock.now_ms() if now is None else now
    state = _cell_state(cell_name)
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
            return []
        now = clock.now_ms() if fixed_now is None else fixed_now
        if cell.alarm_at is None or cell.alarm_at > now + early_ms:
            _wake_after_commit(cell, now)
            return []
        claims, recovered = claim_due_messages(cell, now, max_claims)
        if recovered:
            log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell_name, recovered)
        if claims and dispatch is not None:
            transaction.on_commit(lambda: dispatch(claims), robust=True)
        name, new_alarm = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_fire(name, new_alarm, now), robust=True)
    return claims


def due_cell_names(at: int, *, limit: int = 10_000) -> list[str]:
    """Names of the cells whose alarm is ``≤ at``, longest-waiting (earliest alarm) first; one index scan."""
    return list(
        QueueCell.objects.filter(alarm_at__lte=at).order_by("alarm_at", "name").values_list("name", flat=True)[:limit]
    )


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


# --------------------------------------------------------------------------- delivery outcomes (§7.6, §7.7)


_DELIVERY_COLUMNS = (
    "message_id", "queue_name", "pathname", "body", "target_base_url", "idempotency_key",
    "attempt", "enqueued_at", "deliveries",
)


def start_delivery(claim: Claim, now: int | None = None) -> DeliveryRow | None:
    """Mark the POST of ``claim`` as begun and return the message to POST, or None.

    A single compare-and-set statement (``UPDATE … RETURNING``): it succeeds
    only while the message still carries this claim token, the POST of this
    claim has not begun yet and the claim's deadline has not passed. None
    means "skip": a duplicated or late delivery task, or a claim that was
    already recovered. Records ``last_attempt_at`` and counts the POST in
    ``deliveries``.

    The claim's deadline restarts here: ``now + QUEUE_DELIVERY_TIMEOUT_MS +
    30 000``. Time a claim spends waiting for a delivery thread (a busy
    Celery pool, the broker) therefore never eats into the time its POST may
    take, so a slow but timely answer is not raced by a redelivery. The
    cell's alarm may still name the claim-time deadline; firing then finds
    nothing lost and moves the alarm to the new one.
    """
    now = clock.now_ms() if now is None else now
    deadline = clamp_ms(now + config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS)
    qn = connection.ops.quote_name
    sql = (
        f"UPDATE {qn(Message._meta.db_table)} SET {qn('delivery_started_at')} = %s, "
        f"{qn('last_attempt_at')} = %s, {qn('deliveries')} = {qn('deliveries')} + 1, {qn('updated_at')} = %s, "
        f"{qn('inflight_deadline')} = %s "
        f"WHERE {qn('id')} = %s AND {qn('claim_token')} = %s AND {qn('delivery_started_at')} IS NULL "
        f"AND {qn('inflight_deadline')} > %s "
        f"RETURNING {', '.join(qn(c) for c in _DELIVERY_COLUMNS)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [now, now, now, deadline, claim.message_pk, claim.token, now])
        row = cursor.fetchone()
    if row is None:
        return None
    mid, qname, pathname, body, base, key, attempt, enqueued_at, deliveries = row
    return DeliveryRow(mid, qname, pathname, codec.decode(body), base, key, attempt, enqueued_at, deliveries)


def _claimed(claim: Claim):
    return Message.objects.filter(pk=claim.message_pk, claim_token=claim.token)


Apply = Callable[[QueueCell, int], bool]


def _outcome_transaction(
    claim: Claim, now: int | None, apply: Apply, claim_next: bool | int
) -> tuple[bool, list[Claim]]:
    """One outcome transition: lock the claim's cell, read ``now`` (unless given), run
    ``apply(cell, now)`` (False = stale claim: nothing written), then either
    ``scheduleNextAlarm(now)`` or — with ``claim_next`` — the claim phase
    (§7.4) right away, so the freed in-flight slot is refilled in the same
    transaction (§12 A14); ``claim_next`` True claims what the slots allow, an
    integer ``n > 0`` at most ``n``. Returns ``(applied, new_claims)``.
    """
    claims: list[Claim] = []
    with transaction.atomic():
        cell = QueueCell.objects.select_for_update().filter(pk=claim.cell_id).first()
        if cell is None:
            return False, []
        now = clock.now_ms() if now is None else now
        if not apply(cell, now):
            _wake_after_commit(cell, now)
            return False, []
        if claim_next:
            claims, recovered = claim_due_messages(cell, now, None if claim_next is True else int(claim_next))
            if recovered:
                log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell.name, recovered)
            transaction.on_commit(lambda: wake.after_fire(cell.name, cell.alarm_at, now), robust=True)
        else:
            schedule_next_alarm(cell, now)
            _wake_after_commit(cell, now)
    return True, claims


def _ack(claim: Claim) -> Apply:
    """Ack / drop: delete the message, which ends its claim and releases its key (§7.7).

    Unlike the other outcomes this does not need the claim to be current: the
    application accepted (or permanently refused) the message, so — as
    upstream, whose ack deletes ``msg:<id>`` whatever its claim state — a 2xx
    (or 404/409/410/422) that arrives after the claim was recovered still
    deletes the message while it exists, whether it is due again or already
    re-claimed by another delivery. That other delivery then finds no row:
    its POST is skipped if not begun, and its outcome is ``"stale"`` and
    changes nothing. The message is deleted at most once, so never acked twice.
    """

    def ack(cell: QueueCell, now: int) -> bool:
        if _claimed(claim).delete()[0]:
            return True
        late = Message.objects.filter(pk=claim.message_pk, cell_id=cell.pk, message_id=claim.message_id).delete()[0]
        if late:
            log.warning(
                "queue cell %s: %s answered after its claim was recovered; acked all the same",
                cell.name, claim.message_id,
            )
        return late > 0

    return ack


def _redeliver(claim: Claim, timeout_seconds: float, status: int) -> Apply:
    """503 ``{"timeoutSeconds": n}``: due again at ``now + n × 1000``; attempt, last error and key kept."""
    return lambda cell, now: _claimed(claim).update(
        due_at=clamp_ms(now + timeout_seconds * 1000), inflight_deadline=None, claim_token=None,
        delivery_started_at=None, last_status=status, updated_at=now,
    ) > 0


def _retry(claim: Claim, row: DeliveryRow, reason: str, status: int | None) -> tuple[Apply, str]:
    """A counted failure: ``attempt + 1``; a dead letter at ``QUEUE_MAX_ATTEMPTS``, else due after the backoff."""
    attempt = row.attempt + 1
    if attempt < config.max_attempts():
        return (
            lambda cell, now: _claimed(claim).update(
                attempt=attempt, last_error=reason, last_status=status,
                due_at=clamp_ms(now + backoff_seconds(attempt) * 1000), inflight_deadline=None,
                claim_token=None, delivery_started_at=None, updated_at=now,
            ) > 0,
            "retry scheduled",
        )

    def dead_letter(cell: QueueCell, now: int) -> bool:
        if _claimed(claim).delete()[0] == 0:
            return False
        key = dlq_key(now, row.message_id)
        DeadLetter.objects.filter(cell=cell, dlq_key=key).delete()  # the same key overwrites, as upstream
        DeadLetter.objects.create(
            cell=cell, dlq_key=key, message_id=row.message_id, queue_name=row.queue_name,
            pathname=row.pathname, body=codec.encode(row.body), target_base_url=row.target_base_url,
            idempotency_key=row.idempotency_key, attempt=attempt, enqueued_at=row.enqueued_at,
            last_error=reason, last_status=status, deliveries=row.deliveries, failed_at=now,
        )
        return True

    return dead_letter, "dead-lettered"


def ack_message(claim: Claim, now: int | None = None) -> bool:
    """Ack (2xx): delete the message; False (nothing changed) when the claim is stale (§7.7)."""
    return _outcome_transaction(claim, now, _ack(claim), False)[0]


def drop_message(claim: Claim, now: int | None = None) -> bool:
    """Permanent failure (404/409/410/422): the same transition as an ack, no dead letter (§7.6)."""
    return ack_message(claim, now)


def redeliver_later(claim: Claim, timeout_seconds: float, now: int | None = None, status: int = 503) -> bool:
    """503 ``{"timeoutSeconds": n}``: due at ``now + n × 1000`` ms, not counted (§7.6); n may be 0 or negative."""
    return _outcome_transaction(claim, now, _redeliver(claim, timeout_seconds, status), False)[0]


def retry_message(
    claim: Claim, row: DeliveryRow, reason: str, now: int | None = None, status: int | None = None
) -> str:
    """A counted failure (§7.7): retry after ``min(60, 2^attempt)`` s, or dead-letter.

    ``attempt = row.attempt + 1`` (the row as claimed). When it reaches
    ``QUEUE_MAX_ATTEMPTS`` the message moves to ``DeadLetter`` under
    ``dlq:<ms13 now>:<id>`` (key released); otherwise it records ``attempt``,
    ``last_error = reason`` and is due after the backoff.
    Returns ``"dead-lettered"``, ``"retry scheduled"`` or ``"stale"``.
    """
    apply, label = _retry(claim, row, reason, status)
    return label if _outcome_transaction(claim, now, apply, False)[0] else "stale"


def apply_outcome(
    claim: Claim,
    row: DeliveryRow,
    kind: str,
    *,
    status: int | None = None,
    reason: str | None = None,
    timeout_seconds: float | None = None,
    now: int | None = None,
    claim_next: bool | int = False,
) -> str | tuple[str, list[Claim]]:
    """Apply one classified delivery result (PROTOCOL.md §7.6) to the claimed message.

    ``kind`` is ``"ack"``, ``"drop"``, ``"redeliver"`` (needs ``timeout_seconds``)
    or ``"retry"`` (needs ``reason``). Returns what happened: ``"acked"``,
    ``"dropped"``, ``"redelivery scheduled"``, ``"retry scheduled"``,
    ``"dead-lettered"`` or ``"stale"`` (the claim was no longer current;
    nothing changed). With ``claim_next`` (True, or an integer cap > 0) the
    same transaction also runs the claim phase and the result is
    ``(what happened, new claims)``; otherwise
    the cell's driver is woken on commit when work is due.
    Raises on database errors: the transaction rolled back and the claim
    stays in flight until its deadline (§7.7). ``now`` defaults to the clock
    read once the cell is locked.
    """
    if kind in ("ack", "drop"):
        apply, label = _ack(claim), "acked" if kind == "ack" else "dropped"
    elif kind == "redeliver":
        apply, label = _redeliver(claim, timeout_seconds, status or 503), "redelivery scheduled"
    elif kind == "retry":
        apply, label = _retry(claim, row, reason or "unknown error", status)
    else:
        raise ValueError(f"unknown delivery outcome {kind!r}")
    applied, claims = _outcome_transaction(claim, now, apply, claim_next)
    result = label if applied else "stale"
    return (result, claims) if claim_next else result


# --------------------------------------------------------------------------- admin methods (§7.9)


def _count(qs) -> Subquery:
    return Coalesce(Subquery(qs.order_by().values("cell_id").annotate(n=Count("*")).values("n")), Value(0))


def cell_stats(cell_name: str) -> dict[str, Any]:
    """``{"pending","inflight","deadLetters","alarmAt"}`` of a cell in one read (PROTOCOL.md §7.9).

    ``pending`` counts scheduled messages, ``inflight`` claimed ones. A cell
    that was never written answers zeros and ``alarmAt: None``. Never locks.
    """
    row = (
        QueueCell.objects.filter(name=cell_name)
        .annotate(
            pending=_count(Message.objects.filter(cell_id=OuterRef("pk"), due_at__isnull=False)),
            inflight=_count(Message.objects.filter(cell_id=OuterRef("pk"), inflight_deadline__isnull=False)),
            dead=_count(DeadLetter.objects.filter(cell_id=OuterRef("pk"))),
        )
        .values_list("pending", "inflight", "dead", "alarm_at")
        .first()
    )
    pending, inflight, dead, alarm_at = row or (0, 0, 0, None)
    return {"pending": pending, "inflight": inflight, "deadLetters": dead, "alarmAt": alarm_at}


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
    """A P4 page of dead letters (PROTOCOL.md §4.0, §7.9), ordered by ``dlq:`` key.

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


def redrive_dead_letter(cell_name: str, message_id: str, now: int | None = None) -> dict[str, bool]:
    """Move the first dead letter (in key order) of ``message_id`` back to the queue (§7.9).

    The message starts over: attempt 0, no last error, ``enqueuedAt`` and
    ``targetBaseUrl`` kept, due now, ``armAlarmAtMost(now)``. Refuses with
    ``{"ok": False}`` (changing nothing) when another live message holds its
    idempotency key, or when there is no such dead letter.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"ok": False}
        now = clock.now_ms() if now is None else now
        _wake_after_commit(cell, now)
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
            target_base_url=dead.target_base_url,
            idempotency_key=dead.idempotency_key,
            enqueued_at=dead.enqueued_at,
            due_at=now,
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
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"purged": 0}
        _wake_after_commit(cell, clock.now_ms())
        purged, _ = DeadLetter.objects.filter(cell=cell).delete()
    return {"purged": purged}


def rearm_alarm(cell_name: str, now: int | None = None) -> dict[str, int | None]:
    """``scheduleNextAlarm(now)`` and report the alarm: ``{"alarmAt": ms|None}`` (§7.9).

    The operator's recovery hatch; the cell's driver is woken on commit when
    the alarm is due. A cell that was never written answers ``None``.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return {"alarmAt": None}
        now = clock.now_ms() if now is None else now
        _wake_after_commit(cell, now)
        schedule_next_alarm(cell, now)
    return {"alarmAt": cell.alarm_at}


def rearm_cell(cell_name: str, now: int | None = None, *, dry_run: bool = False) -> RearmReport | None:
    """Repair one cell's schedule (``manage.py rearm_alarms``).

    In one transaction: claims past their deadline become due now, the alarm
    is recomputed (``scheduleNextAlarm``), and the cell's driver is woken on
    commit. ``dry_run`` computes the same report and rolls back. Returns
    None for an unknown cell.
    """
    with transaction.atomic():
        cell = _lock_cell(cell_name)
        if cell is None:
            return None
        now = clock.now_ms() if now is None else now
        before = cell.alarm_at
        recovered = Message.objects.filter(cell=cell, inflight_deadline__lte=now).update(
            due_at=now, inflight_deadline=None, claim_token=None, delivery_started_at=None, updated_at=now
        )
        schedule_next_alarm(cell, now)
        stats = cell_stats(cell_name)
        if dry_run:
            transaction.set_rollback(True)
        else:
            _wake_after_commit(cell, now)
    return RearmReport(
        name=cell_name,
        pending=stats["pending"],
        inflight=stats["inflight"],
        dead_letters=stats["deadLetters"],
        alarm_before=before,
        alarm_after=cell.alarm_at,
        recovered=recovered,
    )
