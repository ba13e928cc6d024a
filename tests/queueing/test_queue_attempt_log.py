"""The attempt log and the per-minute outcome counters (queueing/attempt_log.py, docs/queue-console.md):
real HTTP deliveries answered 200 / 500 / a hang-up / too slowly, on both outcome paths
(the general path, and PostgreSQL's one-trip script when the delivery refills its slot),
crash safety (attempt and outcome commit together or not at all), the cap, retention.
"""
from __future__ import annotations

import pytest

from queueing import attempt_log, delivery, machine
from queueing.models import DeadLetter, DeliveryAttempt, Message, OutcomeMinute
from .support import HANG_UP, Answer, tick
from .test_queue_atomicity import fail_next_sql, starts

pytestmark = pytest.mark.django_db

Q = "q:0"


def run(vclock, advance_ms: int, path: str) -> list:
    """``tick``, but on ``path == "refill"`` each delivery refills its slot (the one-trip script on PostgreSQL)."""
    if path == "alone":
        return tick(vclock, advance_ms)
    vclock.advance(max(1, advance_ms))
    return [delivery.deliver_and_claim_next(c)[0] for c in machine.fire_due_alarms()]


def attempts(mid: str) -> list[DeliveryAttempt]:
    return list(DeliveryAttempt.objects.filter(message_id=mid).order_by("id"))


def counts() -> dict[str, int]:
    totals = dict.fromkeys(attempt_log.COUNTERS, 0)
    for m in OutcomeMinute.objects.all():
        for c in totals:
            totals[c] += getattr(m, c)
    return totals


@pytest.mark.parametrize("path", ["alone", "refill"])
def test_failed_attempts_are_logged_with_status_head_and_time_and_the_dead_letter_keeps_them(
    queue, sink, vclock, settings, path
):
    settings.QUEUE_MAX_ATTEMPTS = "3"
    big = b'{"error":"down","detail":"' + b"x" * 2000 + b'"}'
    sink.answer(Answer(500, big), Answer(HANG_UP), Answer(502, b"\x00\xffbad gateway"))
    queue.enqueue(messageId="m_fail")
    t0 = vclock.now
    run(vclock, 0, path)
    run(vclock, 2_100, path)
    run(vclock, 4_100, path)
    assert DeadLetter.objects.filter(message_id="m_fail").exists()
    first, second, third = attempts("m_fail")
    assert (first.attempt, first.status, first.error, first.result) == (1, 500, "HTTP 500", "retry scheduled")
    assert first.answer_head == big[:attempt_log.HEAD_BYTES].decode()
    assert first.started_at == t0 + 1 and 0 <= first.duration_ms < 5_000
    assert (second.attempt, second.status, second.result) == (2, None, "retry scheduled")
    assert second.error.startswith("transport error: ") and second.answer_head is None
    assert (third.attempt, third.status, third.result) == (3, 502, "dead-lettered")
    assert third.answer_head == "\\x00\\xffbad gateway"  # NUL and undecodable bytes escaped
    assert counts() == {"delivered": 0, "dropped": 0, "retried": 2, "dead_lettered": 1}
    [minute] = OutcomeMinute.objects.all()
    assert (minute.queue_name, minute.minute) == ("__wkf_step_test", t0 // 60_000)


@pytest.mark.parametrize("path", ["alone", "refill"])
def test_an_ack_deletes_the_attempts_of_its_message_and_counts_as_delivered(queue, sink, vclock, path):
    script = [Answer(500), Answer(503, {"timeoutSeconds": 1}), Answer(200)]
    sink.script(lambda rec: script.pop(0) if rec.message_id == "m_ok" else Answer(200))
    queue.enqueue(messageId="m_ok")
    queue.enqueue(messageId="m_first_try_ok")
    run(vclock, 0, path)
    assert [a.result for a in attempts("m_ok")] == ["retry scheduled"]
    run(vclock, 2_100, path)
    assert [a.result for a in attempts("m_ok")] == ["retry scheduled", "redelivery scheduled"]
    assert attempts("m_ok")[1].status == 503
    run(vclock, 1_100, path)
    assert not Message.objects.exists()
    assert not DeliveryAttempt.objects.exists()
    assert sink.count() == 4
    assert counts() == {"delivered": 2, "dropped": 0, "retried": 2, "dead_lettered": 0}


def test_a_timed_out_post_is_logged_as_a_transport_error_with_its_duration(queue, sink, vclock, settings):
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "300"
    sink.hold()
    try:
        queue.enqueue(messageId="slow")
        tick(vclock)
    finally:
        sink.release()
    [a] = attempts("slow")
    assert a.status is None and a.error.startswith("transport error: ReadTimeout")
    assert 250 <= a.duration_ms < 3_000


def test_a_permanent_refusal_counts_as_dropped_and_logs_nothing(queue, sink, vclock):
    sink.answer(Answer(410))
    queue.enqueue(messageId="gone")
    tick(vclock)
    assert not DeliveryAttempt.objects.exists()
    assert counts()["dropped"] == 1


def test_the_log_keeps_the_newest_attempts_of_a_message_up_to_the_cap(queue, sink, vclock):
    sink.answer(Answer(503, {"timeoutSeconds": 0}))  # redelivered forever, never counted
    queue.enqueue(messageId="loop")
    for _ in range(attempt_log.KEEP_PER_MESSAGE + 5):
        tick(vclock, 1)
    logged = attempts("loop")
    assert len(logged) == attempt_log.KEEP_PER_MESSAGE
    assert Message.objects.get(message_id="loop").deliveries == attempt_log.KEEP_PER_MESSAGE + 5
    assert logged[-1].started_at - logged[0].started_at >= attempt_log.KEEP_PER_MESSAGE - 1


def test_a_failing_attempt_write_rolls_the_outcome_back_with_it(queue, sink, vclock):
    sink.answer(Answer(500))
    queue.enqueue(messageId="m_crash")
    with fail_next_sql(lambda s: 'INSERT INTO "queueing_deliveryattempt"' in s):
        [result] = tick(vclock)
    assert isinstance(result, RuntimeError)
    row = Message.objects.get(message_id="m_crash")
    assert row.attempt == 0 and row.inflight_deadline is not None and row.last_error is None
    assert not DeliveryAttempt.objects.exists() and not OutcomeMinute.objects.exists()


def test_a_failing_outcome_write_leaves_no_attempt_or_count(queue, sink, vclock):
    sink.answer(Answer(500))
    queue.enqueue(messageId="m_crash2")
    with fail_next_sql(starts('UPDATE "queueing_message" SET "attempt"')):
        [result] = tick(vclock)
    assert isinstance(result, RuntimeError)
    assert not DeliveryAttempt.objects.exists() and not OutcomeMinute.objects.exists()


def test_retention_prunes_old_minutes_and_the_attempts_of_purged_dead_letters(queue, sink, vclock, settings):
    settings.QUEUE_MAX_ATTEMPTS = "1"
    sink.answer(Answer(500))
    queue.enqueue(messageId="m_dead")
    queue.enqueue(messageId="m_kept")
    tick(vclock)
    assert DeliveryAttempt.objects.count() == 2
    DeadLetter.objects.filter(message_id="m_dead").delete()  # purged (or swept with its run)
    now = vclock.now
    assert attempt_log.prune(now) == {"minutes": 0, "attempts": 1}
    assert [a.message_id for a in DeliveryAttempt.objects.all()] == ["m_kept"]
    later = now + (attempt_log.KEEP_MINUTES + 1) * 60_000
    assert attempt_log.prune(later) == {"minutes": 1, "attempts": 0}
    assert not OutcomeMinute.objects.exists()


def test_the_minute_series_sums_shards_per_queue_name_and_minute(queue, sink, vclock):
    sink.answer(Answer(200))
    queue.enqueue(messageId="a")
    queue.enqueue(messageId="b", shards=1)
    tick(vclock)
    vclock.advance(60_000)
    queue.enqueue(messageId="c")
    tick(vclock)
    OutcomeMinute.objects.create(cell_id=999_999, queue_name="__wkf_step_test", minute=vclock.now // 60_000,
                                 delivered=4)  # another shard's counter row
    series = attempt_log.minute_series(60, vclock.now)
    delivered = series["queues"]["__wkf_step_test"]["delivered"]
    assert delivered[-1] == 5 and delivered[-2] == 2 and sum(delivered) == 7
    assert series["totals"]["delivered"] == 7


def test_the_lifecycle_tick_prunes_old_minutes(queue, sink, vclock):
    from cells import ticker

    OutcomeMinute.objects.create(cell_id=1, queue_name="q", minute=vclock.now // 60_000 - attempt_log.KEEP_MINUTES - 5,
                                 delivered=1)
    OutcomeMinute.objects.create(cell_id=1, queue_name="q", minute=vclock.now // 60_000, delivered=1)
    ticker.tick()
    assert list(OutcomeMinute.objects.values_list("minute", flat=True)) == [vclock.now // 60_000]
