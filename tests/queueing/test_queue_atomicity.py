"""Crash safety of the queue: every transition is all-or-nothing, lost claims come back
(docs/protocol.md §7.3, §7.4, §7.7, §14 item 9; §11.6 items 38, 39, 45, 46, 47, 52).

A fault is injected by failing one SQL statement inside the transition
(``connection.execute_wrapper``), like upstream's ``failNextMutation``.
"""
from __future__ import annotations

import contextlib
import logging

import pytest
from django.db import connection

from queueing import delivery, machine
from queueing.models import DeadLetter, Message, QueueCell
from .support import DEADLINE_MS, Answer, enqueue_request, tick

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("claim_deadline_of_the_protocol")]

Q = "q:0"


@contextlib.contextmanager
def fail_next_sql(predicate, message="injected crash"):
    """Make the next SQL statement for which ``predicate(sql)`` holds raise once."""
    fired: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if not fired and predicate(sql):
            fired.append(sql)
            raise RuntimeError(message)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield fired
    assert fired, "the fault was never injected"


def starts(prefix: str):
    return lambda sql: sql.startswith(prefix)


def test_it_persists_nothing_when_the_enqueue_insert_fails_and_a_replay_delivers_once(rpc, enqueue, sink, vclock):
    req = enqueue_request(messageId="msg_atomic_enqueue", idempotencyKey="atomic-enqueue", target=sink.url)
    with fail_next_sql(starts('INSERT INTO "queueing_message"')):
        status, body = rpc("queue", Q, "enqueue", req)
    assert status == 500 and body["error"]["message"] == "injected crash"
    assert not Message.objects.exists()
    assert rpc.ok("queue", Q, "enqueue", req)["deduped"] is False
    tick(vclock)
    assert sink.count() == 1


def test_it_rolls_back_the_stored_message_when_the_alarm_write_fails(rpc, sink, vclock):
    req = enqueue_request(messageId="m", idempotencyKey="k", target=sink.url)
    with fail_next_sql(starts('UPDATE "queueing_queuecell" SET "alarm_at"')):
        assert rpc("queue", Q, "enqueue", req)[0] == 500
    assert not Message.objects.exists()
    assert not QueueCell.objects.exists()
    assert rpc.ok("queue", Q, "enqueue", req) == {"ok": True, "messageId": "m", "deduped": False}
    tick(vclock)
    assert sink.count() == 1


def test_it_keeps_a_message_recoverable_when_the_ack_fails(enqueue, sink, vclock, stats):
    enqueue(messageId="msg_atomic_ack", idempotencyKey="atomic-ack")
    with fail_next_sql(starts('DELETE FROM "queueing_message"')):
        [result] = tick(vclock)
    assert isinstance(result, RuntimeError)
    row = Message.objects.get(message_id="msg_atomic_ack")  # msg: still exists, key still held
    assert row.inflight_deadline == vclock.now + DEADLINE_MS
    assert enqueue(messageId="dup", idempotencyKey="atomic-ack")["deduped"] is True
    assert stats()["alarmAt"] == vclock.now + DEADLINE_MS
    tick(vclock, DEADLINE_MS - 1)
    assert sink.count() == 1
    tick(vclock)  # deadline reached: recovered and delivered again, not counted as an attempt
    assert [r.attempt for r in sink.requests] == ["1", "1"]
    assert stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_keeps_a_message_recoverable_when_the_retry_update_fails(enqueue, sink, vclock, stats):
    sink.answer(Answer(500, {"error": "retry me"}))
    enqueue(messageId="msg_atomic_retry", idempotencyKey="atomic-retry")
    with fail_next_sql(lambda sql: sql.startswith('UPDATE "queueing_message"') and '"last_error"' in sql):
        tick(vclock)
    row = Message.objects.get(message_id="msg_atomic_retry")
    assert (row.attempt, row.last_error) == (0, None)
    s = stats()
    assert s["pending"] + s["inflight"] == 1 and s["alarmAt"] is not None


def test_it_keeps_a_message_recoverable_when_the_dead_letter_write_fails(enqueue, sink, vclock, stats):
    sink.answer(Answer(500, {"error": "dead letter me"}))
    enqueue(messageId="msg_atomic_dlq", idempotencyKey="atomic-dlq")
    Message.objects.update(attempt=4)
    with fail_next_sql(starts('INSERT INTO "queueing_deadletter"')):
        tick(vclock)
    assert Message.objects.filter(message_id="msg_atomic_dlq", attempt=4).exists()
    s = stats()
    assert s["pending"] + s["inflight"] + s["deadLetters"] == 1 and s["alarmAt"] is not None
    tick(vclock, DEADLINE_MS)  # recovered; the fifth failure now dead-letters for real
    assert stats() == {"pending": 0, "inflight": 0, "deadLetters": 1, "alarmAt": None}


def test_it_never_shows_a_dead_and_a_live_copy_when_the_redrive_fails(rpc, enqueue, sink, vclock, stats):
    sink.answer(Answer(500))
    enqueue(messageId="msg_atomic_redrive", idempotencyKey="atomic-redrive")
    for ms in (0, 2_100, 4_100, 8_100, 16_100):
        tick(vclock, ms)
    assert stats()["deadLetters"] == 1
    with fail_next_sql(starts('DELETE FROM "queueing_deadletter"')):
        status, body = rpc("queue", Q, "redriveDeadLetter", "msg_atomic_redrive")
    assert status == 500
    dead = DeadLetter.objects.filter(message_id="msg_atomic_redrive").count()
    live = Message.objects.filter(message_id="msg_atomic_redrive").count()
    assert dead + live == 1
    assert rpc.ok("queue", Q, "redriveDeadLetter", "msg_atomic_redrive") == {"ok": True}
    assert (DeadLetter.objects.count(), Message.objects.count()) == (0, 1)


def test_it_keeps_the_claim_when_the_claim_transaction_fails(enqueue, sink, vclock, stats, caplog):
    enqueue(messageId="m")
    with caplog.at_level(logging.ERROR, logger="queueing.machine"):
        with fail_next_sql(lambda sql: sql.startswith('UPDATE "queueing_message"') and '"claim_token"' in sql):
            assert tick(vclock) == []
    assert "queue cell q:0: alarm handler failed" in caplog.text
    assert stats()["pending"] == 1 and stats()["inflight"] == 0  # nothing half-claimed
    tick(vclock)  # the alarm stayed due: the next tick claims it
    assert sink.count() == 1


def test_it_recovers_a_lost_claim_after_its_deadline(enqueue, sink, vclock):
    # a message with no schedule, an expired claim and an alarm due now (item 47)
    enqueue(messageId="msg_k")
    Message.objects.update(due_at=None, inflight_deadline=vclock.now - 1, claim_token="lost")
    QueueCell.objects.update(alarm_at=vclock.now)
    tick(vclock)
    tick(vclock)
    assert sink.count() == 1
    assert not Message.objects.exists()


def test_it_redelivers_a_claim_whose_worker_died_before_posting(enqueue, sink, vclock):
    enqueue(messageId="m")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()  # ... and the delivery task is lost
    tick(vclock, DEADLINE_MS - 1)
    assert sink.count() == 0
    tick(vclock)
    assert sink.count() == 1 and sink.requests[0].attempt == "1"
    assert delivery.deliver_claim(claim) is None  # the lost task turning up late does nothing
    assert sink.count() == 1


def test_it_redelivers_a_claim_whose_worker_died_mid_delivery_and_ignores_its_late_outcome(enqueue, sink, vclock):
    enqueue(messageId="m", idempotencyKey="k")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    row = machine.start_delivery(claim)  # the POST began; the worker is killed here
    assert row.attempt == 0
    tick(vclock, DEADLINE_MS - 1)
    [report] = tick(vclock)  # recovered at the deadline and delivered again
    assert report.result == "acked" and sink.requests[-1].attempt == "1"
    assert Message.objects.count() == 0
    # the dead worker's outcome arriving after all changes nothing
    assert machine.apply_outcome(claim, row, "retry", status=500, reason="HTTP 500") == "stale"
    assert machine.apply_outcome(claim, row, "ack") == "stale"
    assert not Message.objects.exists() and not DeadLetter.objects.exists()


def test_it_restarts_the_claim_deadline_when_the_post_begins(enqueue, sink, vclock, stats):
    """Time spent waiting for a delivery thread does not count against the POST (§7.5)."""
    enqueue(messageId="m")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    claimed_at = vclock.now
    vclock.advance(DEADLINE_MS - 10)  # the delivery task waited for a worker thread
    row = machine.start_delivery(claim)
    assert row is not None
    assert Message.objects.get().inflight_deadline == vclock.now + DEADLINE_MS
    vclock.advance(20)  # past the claim-time deadline: the alarm fires and finds nothing lost
    assert stats()["alarmAt"] == claimed_at + DEADLINE_MS
    assert machine.fire_due_alarms() == []
    assert stats()["alarmAt"] == claimed_at + 2 * DEADLINE_MS - 10
    assert machine.apply_outcome(claim, row, "ack") == "acked"
    assert stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_does_not_start_a_claim_whose_deadline_passed(enqueue, sink, vclock):
    enqueue(messageId="m")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    vclock.advance(DEADLINE_MS)
    assert machine.start_delivery(claim) is None
    assert Message.objects.get().delivery_started_at is None


def test_it_does_not_let_a_stale_retry_or_redelivery_touch_a_newer_claim(enqueue, sink, vclock):
    enqueue(messageId="m")
    vclock.advance(1)
    [old] = machine.fire_due_alarms()
    old_row = machine.start_delivery(old)
    vclock.advance(DEADLINE_MS)
    [new] = machine.fire_due_alarms()  # recovered and claimed again
    assert new.token != old.token
    assert machine.apply_outcome(old, old_row, "retry", status=500, reason="HTTP 500") == "stale"
    assert machine.apply_outcome(old, old_row, "redeliver", status=503, timeout_seconds=0) == "stale"
    row = Message.objects.get()
    assert row.claim_token == new.token and row.inflight_deadline == vclock.now + DEADLINE_MS
    assert (row.attempt, row.last_error) == (0, None)
    assert delivery.deliver_claim(new).result == "acked"


@pytest.mark.parametrize("kind,label", [("ack", "acked"), ("drop", "dropped")])
def test_it_acks_a_late_2xx_whose_claim_was_recovered_and_skips_the_redelivery(enqueue, sink, vclock, kind, label):
    enqueue(messageId="m", idempotencyKey="k")
    vclock.advance(1)
    [old] = machine.fire_due_alarms()
    old_row = machine.start_delivery(old)  # the POST is slow...
    vclock.advance(DEADLINE_MS)
    [new] = machine.fire_due_alarms()  # ...so the claim is recovered and the message claimed again
    # the slow POST's 2xx arrives now: the application accepted the message
    assert machine.apply_outcome(old, old_row, kind) == label
    assert not Message.objects.exists()
    assert enqueue(messageId="m2", idempotencyKey="k")["deduped"] is False  # the key was released
    # the newer claim finds nothing to deliver and nothing to apply
    assert delivery.deliver_claim(new) is None
    assert sink.count() == 0
    assert machine.apply_outcome(new, old_row, "ack") == "stale"  # never acked twice
    assert Message.objects.get().message_id == "m2"


def test_it_acks_a_late_2xx_while_the_redelivery_is_in_flight_and_ignores_that_outcome(enqueue, sink, vclock):
    enqueue(messageId="m")
    vclock.advance(1)
    [old] = machine.fire_due_alarms()
    old_row = machine.start_delivery(old)
    vclock.advance(DEADLINE_MS)
    [new] = machine.fire_due_alarms()
    new_row = machine.start_delivery(new)  # the redelivery's POST has begun too
    assert machine.apply_outcome(old, old_row, "ack") == "acked"
    for kind, extra in (("retry", {"status": 500, "reason": "HTTP 500"}), ("ack", {}), ("drop", {})):
        assert machine.apply_outcome(new, new_row, kind, **extra) == "stale"
    assert not Message.objects.exists() and not DeadLetter.objects.exists()
    assert QueueCell.objects.get().alarm_at is None


def test_it_acks_a_late_2xx_of_a_recovered_claim_through_a_real_delivery(enqueue, sink, vclock, monkeypatch):
    enqueue(messageId="m")
    real_post = delivery.post_message

    def slow_post(row, **kw):
        outcome = real_post(row, **kw)
        vclock.advance(DEADLINE_MS)  # the answer took longer than the claim lasted...
        assert machine.fire_due_alarms() != []  # ...and an alarm recovered and re-claimed it
        return outcome

    monkeypatch.setattr(delivery, "post_message", slow_post)
    [report] = tick(vclock)
    assert report.result == "acked"
    monkeypatch.setattr(delivery, "post_message", real_post)
    tick(vclock, DEADLINE_MS)
    assert sink.count() == 1  # delivered once, not re-sent
    assert not Message.objects.exists()


def test_it_ignores_a_late_2xx_for_a_message_that_is_gone(enqueue, sink, vclock):
    enqueue(messageId="m")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    row = machine.start_delivery(claim)
    assert machine.apply_outcome(claim, row, "ack") == "acked"
    assert machine.apply_outcome(claim, row, "ack") == "stale"


def test_it_keeps_firing_other_cells_when_one_cell_fails(rpc, sink, vclock, monkeypatch, caplog):
    for name in ("q:0", "q:1"):
        rpc.ok("queue", name, "enqueue", enqueue_request(messageId=f"m-{name}", target=sink.url))
    real = machine.claim_due_messages

    def broken(cell, now, *args, **kwargs):
        if cell.name == "q:0":
            raise RuntimeError("disk on fire")
        return real(cell, now, *args, **kwargs)

    monkeypatch.setattr(machine.claim, "claim_due_messages", broken)
    with caplog.at_level(logging.ERROR, logger="queueing.machine"):
        tick(vclock)
    assert [r.message_id for r in sink.requests] == ["m-q:1"]
    assert "queue cell q:0: alarm handler failed" in caplog.text and "disk on fire" in caplog.text
    monkeypatch.setattr(machine.claim, "claim_due_messages", real)
    tick(vclock)
    assert sorted(r.message_id for r in sink.requests) == ["m-q:0", "m-q:1"]
