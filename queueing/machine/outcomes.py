"""Delivery outcomes (docs/protocol.md §7.6, §7.7): ack, drop, 503 redelivery, counted retry, dead letter.

Every outcome is a compare-and-set on the claim token (a late ack excepted,
``_ack_late``), applied in one short transaction on the locked cell that
may also run the claim phase for the slot it freed (§12 A14). Concurrent
outcomes of one cell are combined (``apply_outcomes``); on PostgreSQL the
common case is one round trip (``_outcomes_in_one_trip``, text in
``machine.sql.one_trip_outcomes``).
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction

from worldcell import clock

from .. import attempt_log, config, lease, wake
from ..combining import Combiner
from ..models import Message, QueueCell
from . import claim as claiming
from . import db, sql
from .claim import _delivery_row
from .dead_letters import _bury
from .lock import _lock_cell, _wake_after_commit, schedule_next_alarm
from .values import (
    _NO_ROW, _OUTCOME_KINDS, Claim, DeliveryRow, OutcomeRequest, backoff_seconds, clamp_ms, fill_undecided,
)

log = logging.getLogger("queueing.machine")

__all__ = [
    "ack_message", "apply_outcome", "apply_outcomes", "drop_message", "redeliver_later", "retry_message",
]


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
    attempt: "attempt_log.AttemptRecord | None" = None,
) -> str | tuple[str, list[Claim]]:
    """Apply one classified delivery result (docs/protocol.md §7.6) to the claimed message.

    ``kind`` is ``"ack"``, ``"drop"``, ``"redeliver"`` (needs ``timeout_seconds``)
    or ``"retry"`` (needs ``reason``). Returns what happened: ``"acked"``,
    ``"dropped"``, ``"redelivery scheduled"``, ``"retry scheduled"``,
    ``"dead-lettered"`` or ``"stale"`` (the claim was no longer current;
    nothing changed). With ``claim_next`` (True, or an integer cap > 0) the
    same transaction also runs the claim phase and the result is
    ``(what happened, new claims)`` — the first new claim already started
    (``Claim.started``); otherwise the cell's driver is woken on commit when
    work is due. Raises on database errors: the transaction rolled back and
    the claim stays in flight until its deadline (§7.7). ``now`` defaults to
    the clock read once the cell is locked. ``attempt`` (what the POST gave)
    is written to the attempt log and the outcome counters in the outcome's
    own transaction (``queueing.attempt_log``).

    Outcomes of concurrent deliveries from the same cell in this process are
    combined into one transaction (``apply_outcomes``); with an explicit
    ``now``, or inside an ``atomic`` block, the outcome is applied alone.
    """
    if kind not in _OUTCOME_KINDS:
        raise ValueError(f"unknown delivery outcome {kind!r}")
    request = OutcomeRequest(claim, row, kind, status, reason, timeout_seconds, claim_next, attempt)
    if now is not None:
        result, claims = apply_outcomes(claim.cell_id, [request], now)[0]
    else:
        result, claims = _outcome_combiner.submit(claim.cell_id, request)
    return (result, claims) if claim_next else result


def apply_outcomes(
    cell_id: int, requests: list[OutcomeRequest], now: int | None = None
) -> list[tuple[str, list[Claim]]]:
    """Apply delivery results of claims of cell ``cell_id`` in ONE transaction; ``(what happened, new claims)`` each.

    Steps: lock the cell, read ``now`` (unless given); acks and drops of
    current claims are one ``DELETE``, everything else one statement each;
    then, when some applied outcome asked for ``claim_next``, one claim phase
    (§7.4) claims for all of them — the first claim of each is started for
    its delivery thread (``Claim.started``), further ones (within each
    request's cap) are handed to it unstarted — else ``scheduleNextAlarm``
    and a wake-up on commit. An outcome whose claim is no longer current is
    ``"stale"`` and changes nothing (a late ack excepted, see ``_ack_late``).

    On PostgreSQL the transaction commits without waiting for its WAL flush
    (``synchronous_commit = off``), so the cell's lock is released without a
    disk wait. Nothing a client was promised depends on it: should the
    database server crash within the flush delay, these outcomes are lost as
    if the worker had crashed after its POSTs — claims come back after their
    deadline and the messages are delivered again (at least once, never lost:
    enqueues and redrives commit synchronously, and a synchronous commit
    flushes every earlier asynchronous one with it).

    On PostgreSQL, outside any transaction and with the clock read here, the
    outcomes that ask for ``claim_next`` go through ``_outcomes_in_one_trip``
    (all but dead letters); everything else (and an outcome whose claim was
    no longer current) takes the general path below, in a second transaction.
    """
    if now is None and db.one_trip_enabled():
        fast = [i for i, r in enumerate(requests) if _one_trip_outcome(r)]
        if fast:
            decided: list[tuple[str, list[Claim]] | None] = [None] * len(requests)
            for i, r in zip(fast, _outcomes_in_one_trip(cell_id, [requests[i] for i in fast])):
                decided[i] = r
            return fill_undecided(decided, requests, lambda rest: _apply_outcomes(cell_id, rest, None))
    return _apply_outcomes(cell_id, requests, now)


def _apply_outcomes(
    cell_id: int, requests: list[OutcomeRequest], now: int | None
) -> list[tuple[str, list[Claim]]]:
    results: list[tuple[str, list[Claim]]] = [("stale", []) for _ in requests]
    with transaction.atomic():
        db.commit_without_flush()
        cell = _lock_cell(pk=cell_id)
        if cell is None:
            return results
        now = clock.now_ms() if now is None else now
        applied = _apply(cell, requests, now)
        attempt_log.record(cell.pk, requests, applied, now)
        wanting: list[int] = []
        for i, label in enumerate(applied):
            if label is not None:
                results[i] = (label, [])
                if requests[i].claim_next:
                    wanting.append(i)
        if not wanting:
            if any(label is not None for label in applied):
                schedule_next_alarm(cell, now)
            _wake_after_commit(cell, now)
            return results
        caps = [None if requests[i].claim_next is True else int(requests[i].claim_next) for i in wanting]
        total = None if None in caps else sum(caps)
        claims, recovered = claiming.claim_due_messages(cell, now, total, start=len(wanting))
        if recovered:
            log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", cell.name, recovered)
        extra = _hand_out_claims(claims, [results[i][1] for i in wanting], caps)
        name, alarm_at = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_fire(name, alarm_at, now), robust=True)
        if len(wanting) < sum(label is not None for label in applied) or extra:
            _wake_after_commit(cell, now)  # a freed slot nobody refills here
    return results


def _hand_out_claims(claims: list[Claim], lists: list[list[Claim]], caps: list[int | None]) -> list[Claim]:
    """Give each requester (its claim list, its cap) one started claim, then the unstarted rest within caps.

    ``claims`` starts with the started ones (at most one per requester).
    Returns the claims nobody had room for (none when caps allow).
    """
    started = [c for c in claims if c.started is not None]
    extra = [c for c in claims if c.started is None]
    for lst, claim in zip(lists, started):
        lst.append(claim)
    for lst, cap in zip(lists, caps):
        while extra and lst and (cap is None or len(lst) < cap):
            lst.append(extra.pop(0))
    return extra


def _apply(cell: QueueCell, requests: list[OutcomeRequest], now: int) -> list[str | None]:
    """Apply each request's outcome on the locked cell; its label, or None when its claim was not current."""
    labels: list[str | None] = [None] * len(requests)
    acks = [i for i, r in enumerate(requests) if r.kind in ("ack", "drop")]
    if acks:
        params: list[Any] = []
        for i in acks:
            params += [requests[i].claim.message_pk, requests[i].claim.token]
        deleted = {pk for (pk,) in db.rows(sql.delete_current(len(acks)), params)}
        for i in acks:
            r = requests[i]
            if r.claim.message_pk in deleted or _ack_late(cell, r.claim):
                labels[i] = "acked" if r.kind == "ack" else "dropped"
    for i, r in enumerate(requests):
        if r.kind == "redeliver":
            seconds = r.timeout_seconds if r.timeout_seconds is not None else 0
            due_at = clamp_ms(now + seconds * 1000)
            if db.rowcount(sql.REDELIVER, [due_at, r.status or 503, now, r.claim.message_pk, r.claim.token]):
                labels[i] = "redelivery scheduled"
        elif r.kind == "retry":
            labels[i] = _retry(cell, r, now)
    return labels


def _ack_late(cell: QueueCell, claim: Claim) -> bool:
    """Ack / drop of a claim that is no longer current: delete the message all the same, if it still exists.

    The application accepted (or permanently refused) the message, so — as
    upstream, whose ack deletes ``msg:<id>`` whatever its claim state — a 2xx
    (or 404/409/410/422) that arrives after the claim was recovered still
    deletes the message while it exists, whether it is due again or already
    re-claimed by another delivery. That other delivery then finds no row:
    its POST is skipped if not begun, and its outcome is ``"stale"`` and
    changes nothing. The message is deleted at most once, so never acked twice.
    """
    late = db.rowcount(sql.ACK_LATE, [claim.message_pk, cell.pk, claim.message_id])
    if late:
        log.warning(
            "queue cell %s: %s answered after its claim was recovered; acked all the same",
            cell.name, claim.message_id,
        )
    return late > 0


def _retry(cell: QueueCell, r: OutcomeRequest, now: int) -> str | None:
    """A counted failure: ``attempt + 1``; a dead letter at ``QUEUE_MAX_ATTEMPTS``, else due after the backoff."""
    attempt = r.row.attempt + 1
    reason = r.reason or "unknown error"
    claim, row = r.claim, r.row
    if attempt < config.max_attempts():
        due_at = clamp_ms(now + backoff_seconds(attempt) * 1000)
        changed = db.rowcount(sql.RETRY, [attempt, reason, r.status, due_at, now, claim.message_pk, claim.token])
        return "retry scheduled" if changed else None
    if not Message.objects.filter(pk=claim.message_pk, claim_token=claim.token).delete()[0]:
        return None
    _bury(cell, row, attempt, reason, r.status, now)
    return "dead-lettered"


_ONE_TRIP_LABELS = {"ack": "acked", "drop": "dropped", "redeliver": "redelivery scheduled", "retry": "retry scheduled"}


def _one_trip_outcome(r: OutcomeRequest) -> bool:
    """Whether ``_outcomes_in_one_trip`` takes this outcome (everything but dead letters, with ``claim_next``)."""
    if not r.claim_next:
        return False
    if r.kind == "retry":
        return r.row.attempt + 1 < config.max_attempts()
    return True


def _outcomes_in_one_trip(cell_id: int, requests: list[OutcomeRequest]) -> list[tuple[str, list[Claim]] | None]:
    """Outcomes of current claims plus the claim phase for their freed slots, in one round trip.

    Lock the cell; recover lost claims; requeue the 503 redeliveries (due at
    ``now + timeoutSeconds``, not counted) and the counted retries (attempt
    + 1, last error, due after the backoff); delete the acked and dropped
    messages; claim the earliest due messages — a redelivery due now among
    them — for the freed slots within the requests' caps, the first one per
    applied request started; compute ``scheduleNextAlarm(now)``; commit
    without waiting for the WAL flush (see ``apply_outcomes``). Returns per
    request ``(label, claims)``, or None for an outcome whose claim was not
    current (the general path then applies it as a late ack, or finds it
    stale). Wakes as the Python path does: a countdown for a near future
    alarm (``wake.after_fire``).
    """
    now = clock.now_ms()
    token = uuid.uuid4().hex
    deadline = lease.first_deadline(now)  # a claim lease (docs/leases.md)
    caps = [None if r.claim_next is True else int(r.claim_next) for r in requests]
    max_inflight = config.max_inflight()
    acks = [r for r in requests if r.kind in ("ack", "drop")]
    requeues = [r for r in requests if r.kind in ("redeliver", "retry")]
    params: list[Any] = [cell_id, now, now, cell_id, now]
    if requeues:
        params.append(now)
        for r in requeues:
            if r.kind == "redeliver":
                seconds = r.timeout_seconds if r.timeout_seconds is not None else 0
                params += [r.claim.message_pk, r.claim.token, clamp_ms(now + seconds * 1000), r.row.attempt,
                           None, r.status or 503, False]
            else:
                attempt = r.row.attempt + 1
                params += [r.claim.message_pk, r.claim.token, clamp_ms(now + backoff_seconds(attempt) * 1000),
                           attempt, r.reason or "unknown error", r.status, True]
    record, record_params = attempt_log.one_trip(
        cell_id, requests, lambda r: _ONE_TRIP_LABELS[r.kind], now, sql.APPLIED_BEFORE_CLAIM
    )
    params += record_params
    params.append(cell_id)
    for r in acks:
        params += [r.claim.message_pk, r.claim.token]
    params += [cell_id, now]
    for r, c in zip(requests, caps):
        params += [r.claim.message_pk, max_inflight if c is None else min(c, max_inflight)]
    params += [max_inflight, cell_id, deadline, token, now, now, now]  # ..., sql.claim_set's
    params += [now, now + config.MIN_ALARM_DELAY_MS, cell_id, cell_id, cell_id]  # sql.soon's, the alarm's
    locked, recovered, _, rows, [(alarm_at,)] = db.run_script(
        sql.one_trip_outcomes(len(requeues), len(acks), len(requests), record), params
    )
    if not locked:
        return [None] * len(requests)
    name = locked[0][0]
    if recovered:
        log.warning("queue cell %s: recovered %d lost claim(s) past their deadline", name, len(recovered))
    done = {row[1] for row in rows if row[0] == 0}
    claims: list[Claim] = []
    for _, pk, rn, started, *cols in sorted((r for r in rows if r[0] == 1), key=lambda r: r[2]):
        row = _delivery_row(tuple(cols))
        claims.append(Claim(name, cell_id, pk, row.message_id, token, started=row if started else None))
    results: list[tuple[str, list[Claim]] | None] = [None] * len(requests)
    applied: list[int] = []
    for i, r in enumerate(requests):
        if r.claim.message_pk in done:
            results[i] = (_ONE_TRIP_LABELS[r.kind], [])
            applied.append(i)
    leftover = _hand_out_claims(claims, [results[i][1] for i in applied], [caps[i] for i in applied])
    if leftover:  # cannot happen: claims are capped by the applied requests' caps
        log.warning("queue cell %s: %d claim(s) nobody took; left to their deadline", name, len(leftover))
    wake.after_fire(name, alarm_at, now)
    return results


_outcome_combiner: Combiner[OutcomeRequest, tuple[str, list[Claim]]] = Combiner(
    lambda cell_id, requests: apply_outcomes(cell_id, requests)  # type: ignore[arg-type]
)


def ack_message(claim: Claim, now: int | None = None) -> bool:
    """Ack (2xx): delete the message; False (nothing changed) when it is already gone (§7.7)."""
    return apply_outcome(claim, _NO_ROW, "ack", now=now) == "acked"


def drop_message(claim: Claim, now: int | None = None) -> bool:
    """Permanent failure (404/409/410/422): the same transition as an ack, no dead letter (§7.6)."""
    return apply_outcome(claim, _NO_ROW, "drop", now=now) == "dropped"


def redeliver_later(claim: Claim, timeout_seconds: float, now: int | None = None, status: int = 503) -> bool:
    """503 ``{"timeoutSeconds": n}``: due at ``now + n × 1000`` ms, not counted (§7.6); n may be 0 or negative."""
    result = apply_outcome(claim, _NO_ROW, "redeliver", status=status, timeout_seconds=timeout_seconds, now=now)
    return result == "redelivery scheduled"


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
    return apply_outcome(claim, row, "retry", status=status, reason=reason, now=now)  # type: ignore[return-value]


