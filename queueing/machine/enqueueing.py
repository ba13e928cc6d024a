"""Enqueue (docs/protocol.md §7.3): store messages in a cell, dedup on the idempotency key, arm the alarm.

``enqueue`` combines concurrent callers of one process (``queueing.combining``)
into ``enqueue_batch``; on PostgreSQL the common case runs as one round trip
(``_enqueue_in_one_trip``, text in ``machine.sql.one_trip_enqueue``).
"""
from __future__ import annotations

from typing import Any

from django.db import transaction

from cells import fence
from worldcell import clock, codec

from .. import config, wake
from ..combining import Combiner
from ..models import Message, QueueCell
from . import db, sql
from .dead_letters import _fresh_lifecycle, _holder_and_same
from .lock import _lock_cell, _wake_after_commit, arm_alarm_at_most, schedule_next_alarm
from .values import EnqueueRequest, clamp_ms, fill_undecided

__all__ = ["enqueue", "enqueue_batch"]


def _names(request: EnqueueRequest) -> set[tuple[str, str]]:
    """What a request claims in its cell: its message id and (when given) its idempotency key."""
    names = {("id", request.message_id)}
    if request.idempotency_key:
        names.add(("key", request.idempotency_key))
    return names


def _due_at(request: EnqueueRequest, now: int) -> int:
    """When a new message is due: ``now + max(0, delaySeconds) × 1000`` ms, clamped (§7.3)."""
    return clamp_ms(now + max(0, request.delay_seconds or 0) * 1000)


def _stored(message_id: str) -> dict[str, Any]:
    """The answer of an enqueue that stored its message."""
    return {"ok": True, "messageId": message_id, "deduped": False}


def _expired(run_id: str, expired_at: Any) -> dict[str, Any]:
    """The answer to a message of an expired run (``expired_at`` as the tombstone row holds it)."""
    return fence.enqueue_refusal(run_id, codec.to_utc_ms(expired_at))


def _fenced_runs(requests: list[EnqueueRequest]) -> list[str]:
    """The distinct run ids the fence must check for ``requests`` (those with ``fence``), sorted."""
    return sorted({r.run_id for r in requests if r.fence and r.run_id is not None})


def _config_mismatch(pinned: int, got: int) -> dict[str, Any]:
    return {
        "ok": False,
        "code": "CONFIG_MISMATCH",
        "message": (
            f"queue cell shard-count mismatch: pinned {pinned}, got {got} "
            "\u2014 changing queueShards requires draining the fleet"
        ),
    }


def enqueue(cell_name: str, request: EnqueueRequest, now: int | None = None) -> dict[str, Any]:
    """Store one message in cell ``cell_name`` (docs/protocol.md §7.3), one transaction.

    Order: pin ``queueShards`` on the first enqueue, else compare (mismatch ->
    ``{"ok":False,"code":"CONFIG_MISMATCH",…}``, checked before dedup); while
    a live message holds ``idempotency_key`` return it with ``deduped: True``
    (after ``scheduleNextAlarm``); else store the message due at
    ``now + max(0, delaySeconds) × 1000`` ms and ``armAlarmAtMost`` it.
    Re-enqueueing a live ``messageId`` without dedup overwrites it (attempt
    reset; an in-flight claim of it is voided — upstream's quirk of possible
    double delivery). Returns ``{"ok":True,"messageId":…,"deduped":bool}``.

    With ``request.fence`` a message of a run that has a tombstone is refused
    first, inside the same transaction, with ``{"ok":False,"code":"RUN_EXPIRED",…}``
    (``cells.fence.enqueue_refusal``, docs/lifecycle.md §3); with
    ``request.record_flow`` a stored (not deduped) message also becomes its
    run's ``FlowMessageRecord`` in that transaction (docs/lifecycle.md
    "Stuck-run repair") — all or nothing with the message.

    Concurrent enqueues into the same cell from threads of this process are
    combined (``queueing.combining``): one of them runs them all in one
    transaction, in arrival order, exactly as if each had run alone one after
    the other (``enqueue_batch``). Each caller still gets its own answer; a
    failed transaction fails each of them, and nothing of it is stored.
    Called inside an ``atomic`` block, or with an explicit ``now``, the
    enqueue runs alone.
    """
    if now is not None:
        return enqueue_batch(cell_name, [request], now)[0]
    return _enqueue_combiner.submit(cell_name, request)


def enqueue_batch(cell_name: str, requests: list[EnqueueRequest], now: int | None = None) -> list[dict[str, Any]]:
    """``enqueue`` of each request, in order, in ONE transaction on cell ``cell_name``; their answers.

    The common case — new ids, free keys — is three statements whatever the
    number of requests: lock the cell, one multi-row
    ``INSERT … ON CONFLICT DO NOTHING`` (which also counts the claims in
    flight), arm the alarm for the earliest due time. A request whose insert
    conflicts (a live holder of its key, a live message with its id) or that
    repeats an id or key of an earlier request of the batch is then decided
    on its own, in order, as ``enqueue`` describes. The outcome is that of
    running the requests one after the other.

    Wake-up on commit: only when an in-flight slot is free and the cell's
    alarm was not already due. While every slot is taken, a wake-up could
    claim nothing; the delivery that frees a slot claims the next due message
    in its own outcome transaction (which, being serialised after this one by
    the cell lock, sees these messages), and a slot held by a lost claim
    comes free through the alarm (beat / tick). An alarm that is already due
    means a claim phase is already on its way — the wake-up sent by the
    transition that made it due, the outcome of a delivery in flight, or the
    next beat — and it runs after this commit (a claim phase locks the cell;
    the pump retries a due cell it found locked a few ms later), so it sees
    these messages too. This saves a broker round trip per enqueue on a busy
    cell: a burst of enqueues sends one wake-up, not one each.

    On PostgreSQL, outside any transaction and with the clock read here, the
    batch first goes through ``_enqueue_in_one_trip``; only the requests it
    leaves undecided (conflicts, an unknown or unpinned cell, another shard
    count) then take the general path below, in a second transaction.
    """
    if now is None and db.one_trip_enabled():
        decided = _enqueue_in_one_trip(cell_name, requests)
        if decided is not None:
            return fill_undecided(decided, requests, lambda rest: _enqueue_batch(cell_name, rest, None))
    return _enqueue_batch(cell_name, requests, now)


def _enqueue_batch(cell_name: str, requests: list[EnqueueRequest], now: int | None) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(requests)
    with transaction.atomic():
        cell = _lock_cell(cell_name, create=True)
        now = clock.now_ms() if now is None else now
        alarm_before = cell.alarm_at
        if cell.queue_shards is not None:
            pinned = (cell.pk, cell.queue_shards)
            transaction.on_commit(lambda: _known_cells.__setitem__(cell_name, pinned))
        woken = False
        bulk: list[int] = []
        alone: list[int] = []
        seen: set[tuple[str, str]] = set()
        fenced = _fenced_runs(requests)
        dead = dict(db.rows(sql.tombstoned(len(fenced)), fenced)) if fenced else {}
        mismatched = False
        for i, request in enumerate(requests):
            if request.fence and request.run_id in dead:
                results[i] = _expired(request.run_id, dead[request.run_id])
                continue
            if cell.queue_shards is None:
                QueueCell.objects.filter(pk=cell.pk).update(queue_shards=request.queue_shards, pinned_at=now)
                cell.queue_shards, cell.pinned_at = request.queue_shards, now
            elif cell.queue_shards != request.queue_shards:
                results[i] = _config_mismatch(cell.queue_shards, request.queue_shards)
                mismatched = True
                continue
            names = _names(request)
            (alone if names & seen else bulk).append(i)
            seen |= names
        if mismatched:
            _wake_after_commit(cell, now)  # a mismatch held the lock too
            woken = True

        due: dict[int, int] = {}
        bodies: dict[int, str] = {}
        for i in bulk + alone:
            due[i] = _due_at(requests[i], now)
            bodies[i] = codec.encode(requests[i].body)
        inflight = None
        if bulk:
            params: list[Any] = []
            for i in bulk:
                r = requests[i]
                params += [cell.pk, r.message_id, r.queue_name, r.pathname, bodies[i], r.target_base_url,
                           r.idempotency_key, now, due[i], now, r.run_id]
            rows = db.rows(sql.insert_messages(len(bulk)), params + [cell.pk])
            inserted = {mid for mid, _ in rows}
            inflight = rows[0][1] if rows else None
            earliest = None
            for i in bulk:
                if requests[i].message_id in inserted:
                    results[i] = _stored(requests[i].message_id)
                    earliest = due[i] if earliest is None else min(earliest, due[i])
                else:
                    alone.append(i)
            if earliest is not None:
                arm_alarm_at_most(cell, earliest, now)
        if alone:
            if not woken:
                _wake_after_commit(cell, now)
                woken = True
            for i in sorted(alone):
                results[i] = _enqueue_alone(cell, requests[i], now, due[i], bodies[i])
        if not woken and inflight is not None and _enqueue_needs_wake(alarm_before, inflight, now):
            _wake_after_commit(cell, now)
        for i, request in enumerate(requests):  # in arrival order: the last stored one of a run is kept
            if request.record_flow and results[i] == _stored(request.message_id):
                db.rowcount(sql.UPSERT_FLOW_RECORD, [
                    request.run_id, cell_name, request.queue_name, request.pathname, bodies[i],
                    request.target_base_url, request.queue_shards, now,
                ])
    return results  # type: ignore[return-value]


def _enqueue_needs_wake(alarm_before: int | None, inflight: int, now: int) -> bool:
    """Whether new messages need a wake-up of the cell's driver (see ``enqueue_batch``)."""
    return inflight < config.max_inflight() and (alarm_before is None or alarm_before > now + config.MIN_ALARM_DELAY_MS)


def _enqueue_alone(cell: QueueCell, request: EnqueueRequest, now: int, due_at: int, body: str) -> dict[str, Any]:
    """Dedup / overwrite / store one request on a locked cell (the general case of §7.3 steps 2–3)."""
    holder, same = _holder_and_same(cell, request.message_id, request.idempotency_key or None)
    if holder is not None:
        schedule_next_alarm(cell, now)
        return {"ok": True, "messageId": holder[1], "deduped": True}
    fields = dict(
        queue_name=request.queue_name,
        pathname=request.pathname,
        body=body,
        target_base_url=request.target_base_url,
        idempotency_key=request.idempotency_key,
        enqueued_at=now,
        due_at=due_at,
        run_id=request.run_id,
        **_fresh_lifecycle(now),
    )
    if same is not None:
        Message.objects.filter(pk=same[0]).update(**fields)
    else:
        Message.objects.create(cell=cell, message_id=request.message_id, **fields)
    arm_alarm_at_most(cell, due_at, now)
    return _stored(request.message_id)


# --------------------------------------------------------------------------- one-trip transitions (PostgreSQL)
#
# Every transition holds its cell's lock from the ``SELECT … FOR UPDATE`` to
# the commit. Run as separate statements from Python, that is several client
# round trips with the lock held, and on a loaded machine each of them waits
# for the holding thread to get the GIL and a CPU again: 10–25 ms of lock time
# for a three-statement enqueue, which serialises everything else on the cell.
# On PostgreSQL the hottest transitions are therefore sent as ONE
# multi-statement string ``BEGIN; …; COMMIT`` (simple query protocol, client-
# side parameter binding): the server takes the lock, does the work and
# commits without waiting for the client in between. The scripts are built
# from the same SQL fragments as the Python path (which SQLite and every other
# case keep using) where a rule is SQL on both; where the Python path computes
# a rule itself, a property test compares the two (docs/decisions.md "Queue
# rules written once"); the test suite runs every scenario both ways.
#
# Two differences, both harmless: ``now`` is read just before the string is
# sent rather than after the lock is granted (a transition that waited for the
# lock uses a ``now`` up to that wait in the past, which only makes due times
# and alarms slightly earlier), and the batch is decided in SQL, so requests
# the fast path cannot decide on its own (conflicts, unknown cells) are
# returned undecided and go through the general path afterwards.

#: name -> (cell id, pinned shard count) of cells seen pinned in this process
#: (both never change once pinned; a stale entry only makes the fast path
#: decide nothing, because every statement re-checks id, name and pin).
_known_cells: dict[str, tuple[int, int]] = {}


def _enqueue_in_one_trip(cell_name: str, requests: list[EnqueueRequest]) -> list[dict[str, Any] | None] | None:
    """The common case of ``enqueue_batch`` in one round trip; None when the cell is not known pinned here.

    Lock the cell, insert every request that does not repeat an earlier
    one's id or key (``ON CONFLICT DO NOTHING``) and whose run (``fence``)
    has no tombstone — those answer ``RUN_EXPIRED`` —, upsert the
    ``FlowMessageRecord`` of each stored ``record_flow`` request (the last
    of each run; requests left undecided record theirs afterwards, in the general path, so
    the record is the last stored as applied), arm the alarm for the
    earliest inserted due time, count the claims in flight, commit — without
    waiting for the WAL flush, which the script's last statement then waits
    for with the cell's lock already released (a synchronous commit flushes
    every earlier asynchronous one with it): the client is told its message
    is stored only once it is durable, but the cell's lock is not held across
    a disk wait. (A delivery may read the message before that flush ends; a
    database crash in that instant loses an enqueue the client was never told
    succeeded — it retries — while the message may have been delivered:
    at least once, as always.) Returns one
    answer per request, None for those left undecided: a conflict with a live
    message, a repeated id or key, another shard count. Wakes the cell after
    the commit when an in-flight slot is free (see ``enqueue_batch``).
    """
    known = _known_cells.get(cell_name)
    if known is None:
        return None
    cell_id, shards = known
    now = clock.now_ms()
    decided: list[dict[str, Any] | None] = [None] * len(requests)
    bulk: list[int] = []
    seen: set[tuple[str, str]] = set()
    for i, r in enumerate(requests):
        if r.queue_shards != shards:
            continue
        names = _names(r)
        if not names & seen:
            bulk.append(i)
        seen |= names
    if not bulk:
        return decided
    params: list[Any] = [cell_id]
    for i in bulk:
        r = requests[i]
        due_at = _due_at(r, now)
        params += [cell_id, r.message_id, r.queue_name, r.pathname, codec.encode(r.body), r.target_base_url,
                   r.idempotency_key, now, due_at, now, r.run_id]
    fenced = _fenced_runs([requests[i] for i in bulk])
    params += fenced
    soon = [now, now + config.MIN_ALARM_DELAY_MS]
    params += [cell_id, cell_name, shards, *soon, *soon, cell_id]
    records = [(i, requests[i].message_id) for i in bulk if requests[i].record_flow]
    if records:
        params += [cell_name, shards, now]
        for record in records:
            params += record
    params.append(cell_id)
    script = sql.one_trip_enqueue(len(bulk), len(fenced), len(records))
    locked, [(inserted, alarm_at, inflight, dead_runs, dead_at)], _ = db.run_script(script, params)
    if [row[:2] for row in locked] != [(cell_name, shards)]:
        _known_cells.pop(cell_name, None)  # stale (the cell was deleted): the general path re-learns it
        return decided
    inserted = set(inserted)
    dead = dict(zip(dead_runs, dead_at))
    for i in bulk:
        r = requests[i]
        if r.message_id in inserted:
            decided[i] = _stored(r.message_id)
        elif r.fence and r.run_id in dead:
            decided[i] = _expired(r.run_id, dead[r.run_id])
    if _enqueue_needs_wake(locked[0][2], inflight, now):
        wake.after_transition(cell_name, alarm_at, now)
    return decided


_enqueue_combiner: Combiner[EnqueueRequest, dict[str, Any]] = Combiner(
    lambda cell_name, requests: enqueue_batch(cell_name, requests)  # type: ignore[arg-type]
)


