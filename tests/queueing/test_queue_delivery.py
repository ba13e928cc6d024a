"""Queue delivery over real HTTP on a virtual clock: headers, body, taxonomy, backoff,
dead letters, redrive (docs/protocol.md §7.3–7.9; acceptance §11.6 items 36–66).

A tick advances the virtual clock (at least 1 ms), fires every due alarm and
runs the claimed deliveries to completion, like upstream's FakeFleet.
"""
from __future__ import annotations

import json
import time

import pytest

from queueing import machine
from queueing.delivery import delivery_url
from queueing.models import DeadLetter, Message, QueueCell
from .support import HANG_UP, Answer, DripServer, HttpSink, tick

pytestmark = pytest.mark.django_db

Q = "q:0"


def message(mid: str) -> Message:
    return Message.objects.get(message_id=mid)


def fail_five_times(queue, sink, vclock, mid: str, key: str | None = None, answer=Answer(500, {"error": "down"})):
    sink.answer(answer)
    queue.enqueue(messageId=mid, **({"idempotencyKey": key} if key else {}))
    for ms in (0, 2_100, 4_100, 8_100, 16_100):
        tick(vclock, ms)
    assert queue.stats()["deadLetters"] == 1


# --------------------------------------------------------------------------- item 36: the delivery


def test_it_delivers_an_enqueued_message_with_the_vqs_headers_and_acks_on_2xx(queue, sink, vclock):
    assert queue.enqueue(messageId="msg_1", idempotencyKey="step-1") == {
        "ok": True, "messageId": "msg_1", "deduped": False,
    }
    tick(vclock)
    assert sink.count() == 1
    req = sink.requests[0]
    assert req.path == "/.well-known/workflow/v1/step"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["x-vqs-queue-name"] == "__wkf_step_test"
    assert req.headers["x-vqs-message-id"] == "msg_1"
    assert req.headers["x-vqs-message-attempt"] == "1"
    assert "x-workflow-callback-secret" not in req.headers
    assert req.body == b'{"data":"payload"}'
    # only the pinned config is left: no message, schedule, claim or alarm
    assert not Message.objects.exists()
    cell = QueueCell.objects.get(name=Q)
    assert (cell.queue_shards, cell.pinned_at is not None, cell.alarm_at) == (1, True, None)
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_posts_the_body_byte_identical_even_with_unicode_and_nul(queue, sink, vclock):
    body = '{"s":"h\u00e9llo \u2603 \U0001f600","raw":"a\x00b","esc":"\\u0000","bytes":{"__type":"Uint8Array","data":"AAEC"}}'
    queue.enqueue(messageId="msg_u", body=body)
    tick(vclock)
    assert sink.requests[0].body == body.encode("utf-8")


def test_it_sends_the_callback_secret_and_strips_one_trailing_slash(queue, sink, vclock, settings):
    settings.WORKFLOW_CALLBACK_SECRET = "cbs"
    queue.enqueue(messageId="m1", target=sink.url + "/", pathname="flow")
    tick(vclock)
    [req] = sink.requests
    assert req.path == "/.well-known/workflow/v1/flow"
    assert req.headers["x-workflow-callback-secret"] == "cbs"
    assert delivery_url("http://app/", "step") == "http://app/.well-known/workflow/v1/step"
    assert delivery_url("http://app//", "step") == "http://app//.well-known/workflow/v1/step"  # only ONE


def test_it_posts_each_message_to_its_own_target(queue, sink, vclock):
    other = HttpSink()
    try:
        assert queue.enqueue(messageId="msg_url_1")["ok"]
        assert queue.enqueue(messageId="msg_url_2", target=other.url)["ok"]
        tick(vclock)
        assert [r.message_id for r in sink.requests] == ["msg_url_1"]
        assert [r.message_id for r in other.requests] == ["msg_url_2"]
    finally:
        other.close()


# --------------------------------------------------------------------------- dedup (37, 41)


def test_it_dedups_on_the_idempotency_key_until_the_ack_releases_it(queue, sink, vclock):
    queue.enqueue(messageId="msg_a", idempotencyKey="k1")
    assert queue.enqueue(messageId="msg_b", idempotencyKey="k1") == {
        "ok": True, "messageId": "msg_a", "deduped": True,
    }
    tick(vclock)
    assert sink.count() == 1
    assert queue.enqueue(messageId="msg_c", idempotencyKey="k1")["deduped"] is False
    tick(vclock)
    assert [r.message_id for r in sink.requests] == ["msg_a", "msg_c"]


def test_it_treats_an_empty_idempotency_key_as_none(queue, sink, vclock):
    assert queue.enqueue(messageId="e1", idempotencyKey="")["deduped"] is False
    assert queue.enqueue(messageId="e2", idempotencyKey="")["deduped"] is False
    tick(vclock)
    assert sink.count() == 2


def test_it_redelivers_after_503_timeout_seconds_without_counting_and_keeps_the_key(queue, sink, vclock):
    sink.answer(Answer(503, {"timeoutSeconds": 30}), Answer(200))
    queue.enqueue(messageId="msg_e", idempotencyKey="k-e")
    tick(vclock)
    assert sink.count() == 1
    row = message("msg_e")
    assert (row.attempt, row.last_error, row.last_status) == (0, None, 503)
    assert row.due_at == vclock.now + 30_000
    assert queue.enqueue(messageId="msg_f", idempotencyKey="k-e")["deduped"] is True
    tick(vclock, 29_000)
    assert sink.count() == 1
    tick(vclock, 1_000)
    assert sink.count() == 2
    assert sink.requests[1].attempt == "1"
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_loops_on_503_timeout_zero_forever_without_dead_lettering(queue, sink, vclock):
    sink.answer(*([Answer(503, {"timeoutSeconds": 0})] * 12), Answer(200))
    queue.enqueue(messageId="loop", idempotencyKey="loop-key")
    for _ in range(13):
        tick(vclock)
    assert [r.attempt for r in sink.requests] == ["1"] * 13
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


@pytest.mark.parametrize("seconds,due_in", [(0, 0), (-5, -5_000), (2.5, 2_500), (0.0004, 0)])
def test_it_schedules_a_503_redelivery_timeout_seconds_later(queue, sink, vclock, seconds, due_in):
    sink.answer(Answer(503, json.dumps({"timeoutSeconds": seconds})))
    queue.enqueue(messageId="m")
    tick(vclock)
    row = message("m")
    assert row.due_at == vclock.now + due_in
    assert row.attempt == 0
    assert queue.stats()["alarmAt"] == (vclock.now + 1 if due_in <= 0 else vclock.now + due_in)


@pytest.mark.parametrize(
    "body,due_at",
    [
        (b'{"timeoutSeconds":-1e308}', 0),  # x 1000 = -inf: due now (ms13 floor 0), not an OverflowError
        (b'{"timeoutSeconds":-1e400}', 0),  # JSON -Infinity
        (b'{"timeoutSeconds":-' + b"9" * 400 + b"}", 0),  # an integer beyond double range
        (b'{"timeoutSeconds":1e308}', 9_999_999_999_999),  # +inf: the latest representable due time
        (b'{"timeoutSeconds":' + b"9" * 400 + b"}", 9_999_999_999_999),
    ],
)
def test_it_clamps_non_finite_503_delays_instead_of_looping_in_flight(queue, sink, vclock, body, due_at):
    sink.answer(Answer(503, body), Answer(200))
    queue.enqueue(messageId="m")
    [report] = tick(vclock)
    assert report.result == "redelivery scheduled"
    row = message("m")
    assert (row.due_at, row.inflight_deadline, row.attempt) == (due_at, None, 0)
    if due_at == 0:
        assert queue.stats()["alarmAt"] == vclock.now + 1
        [again] = tick(vclock)
        assert again.result == "acked" and sink.count() == 2


def test_it_clamps_every_float_into_the_ms13_range():
    inf = float("inf")
    assert [machine.clamp_ms(v) for v in (-inf, -1e300, -0.5, float("nan"), 0, 12.9, 1e300, inf)] == [
        0, 0, 0, 0, 0, 12, 9_999_999_999_999, 9_999_999_999_999,
    ]


# --------------------------------------------------------------------------- the taxonomy (42, 44, 57–59)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_it_acks_every_2xx(queue, sink, vclock, status):
    sink.answer(Answer(status, b""))
    queue.enqueue(messageId="m", idempotencyKey="k")
    tick(vclock)
    assert not Message.objects.exists()
    assert queue.enqueue(messageId="m2", idempotencyKey="k")["deduped"] is False


@pytest.mark.parametrize("status", [404, 409, 410, 422])
def test_it_drops_permanent_failures_without_retrying_or_dead_lettering(queue, sink, vclock, status):
    sink.answer(Answer(status, {"error": "gone", "permanent": True}))
    queue.enqueue(messageId="msg_g", idempotencyKey="k-g")
    tick(vclock)
    tick(vclock, 120_000)
    assert sink.count() == 1
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}
    assert queue.enqueue(messageId="msg_g2", idempotencyKey="k-g")["deduped"] is False


@pytest.mark.parametrize("status", [100 + 200, 301, 302, 307, 400, 401, 408, 429, 500, 501, 502, 504, 599])
def test_it_retries_every_other_status_as_a_counted_failure(queue, sink, vclock, status):
    sink.answer(Answer(status, {"error": "x"}, {"location": sink.url + "/elsewhere"}))
    queue.enqueue(messageId="m", idempotencyKey="k")
    tick(vclock)
    assert sink.count() == 1  # redirects are not followed
    row = message("m")
    assert (row.attempt, row.last_error, row.last_status) == (1, f"HTTP {status}", status)
    assert row.due_at == vclock.now + 2_000
    assert row.inflight_deadline is None
    assert queue.enqueue(messageId="m2", idempotencyKey="k")["deduped"] is True


@pytest.mark.parametrize(
    "body",
    [b"Service Unavailable", b"", b"{}", b"[]", b"null", b"42", b'{"timeoutSeconds":"5"}',
     b'{"timeoutSeconds":true}', b'{"timeoutSeconds":null}', b'{"timeoutSeconds":NaN}', b'{"timeoutSeconds":5'],
)
def test_it_counts_a_503_without_numeric_timeout_seconds_as_a_retry(queue, sink, vclock, body):
    sink.answer(Answer(503, body))
    queue.enqueue(messageId="m")
    tick(vclock)
    row = message("m")
    assert (row.attempt, row.last_error) == (1, "HTTP 503")
    assert row.due_at == vclock.now + 2_000


def test_it_treats_a_hang_up_as_a_transport_error_and_retries(queue, sink, vclock):
    sink.answer(Answer(HANG_UP), Answer(200))
    queue.enqueue(messageId="msg_j")
    tick(vclock)
    assert sink.count() == 1
    row = message("msg_j")
    assert row.attempt == 1 and row.last_status is None
    assert row.last_error.startswith("transport error: ")
    tick(vclock, 2_100)
    assert sink.count() == 2
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_reports_a_refused_connection_as_a_transport_error(queue, sink, vclock):
    queue.enqueue(messageId="m", target="http://127.0.0.1:1")
    tick(vclock)
    err = message("m").last_error
    assert err.startswith("transport error: ConnectError") and "refused" in err.lower()


def test_it_reports_a_timeout_as_a_transport_error(queue, sink, vclock, settings):
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "300"
    sink.hold()
    try:
        queue.enqueue(messageId="slow")
        tick(vclock)
    finally:
        sink.release()
    row = message("slow")
    assert row.attempt == 1
    assert row.last_error.startswith("transport error: ReadTimeout")


def _row(target: str) -> machine.DeliveryRow:
    return machine.DeliveryRow("m", "__wkf_step_test", "step", "{}", target, None, 0, 0, 0)


def test_it_bounds_the_whole_post_by_the_delivery_timeout_even_when_the_peer_drips_its_headers():
    from queueing.delivery import post_message

    # 38 bytes at one byte per 100 ms: every read succeeds well within the
    # timeout, so only a total deadline stops this after 600 ms (not ~3.8 s)
    drip = DripServer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", interval_s=0.1)
    try:
        t0 = time.monotonic()
        outcome = post_message(_row(drip.url), timeout_ms=600)
        elapsed = time.monotonic() - t0
    finally:
        drip.close()
    assert outcome.kind == "retry" and outcome.status is None
    assert outcome.reason.startswith("transport error: ReadTimeout"), outcome.reason
    assert "600 ms" in outcome.reason
    assert 0.55 <= elapsed < 1.0, elapsed


def test_it_bounds_the_503_body_read_by_the_same_deadline():
    from queueing.delivery import post_message

    body = b'{"timeoutSeconds":0,"pad":"' + b"x" * 60 + b'"}'
    drip = DripServer(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
        interval_s=0.05, head_fast=True,
    )
    try:
        t0 = time.monotonic()
        outcome = post_message(_row(drip.url), timeout_ms=500)
        elapsed = time.monotonic() - t0
    finally:
        drip.close()
    assert (outcome.kind, outcome.reason) == ("retry", "HTTP 503")  # the body never arrived in time
    assert elapsed < 0.9, elapsed


def test_it_applies_the_deadline_to_a_drip_fed_delivery_through_the_queue(queue, vclock, settings):
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "400"
    drip = DripServer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", interval_s=0.1)
    try:
        queue.enqueue(messageId="drip", target=drip.url)
        t0 = time.monotonic()
        [report] = tick(vclock)
        assert time.monotonic() - t0 < 0.9
    finally:
        drip.close()
    assert report.result == "retry scheduled"
    row = message("drip")
    assert row.attempt == 1 and row.last_error.startswith("transport error: ReadTimeout")


def test_it_records_every_attempt_on_the_message(queue, sink, vclock):
    sink.answer(Answer(500), Answer(503, {"timeoutSeconds": 1}), Answer(502))
    queue.enqueue(messageId="m")
    tick(vclock)
    t1 = vclock.now
    row = message("m")
    assert (row.attempt, row.deliveries, row.last_status, row.last_error, row.last_attempt_at) == (
        1, 1, 500, "HTTP 500", t1,
    )
    tick(vclock, 2_000)
    row = message("m")
    assert (row.attempt, row.deliveries, row.last_status, row.last_error) == (1, 2, 503, "HTTP 500")
    tick(vclock, 1_000)
    row = message("m")
    assert (row.attempt, row.deliveries, row.last_status, row.last_error) == (2, 3, 502, "HTTP 502")
    assert row.last_attempt_at == vclock.now


# --------------------------------------------------------------------------- backoff and dead letters (43, 50–53)


def test_it_backs_off_2_4_8_16_seconds_then_dead_letters_the_fifth_failure(queue, sink, vclock):
    sink.answer(Answer(500, {"error": "boom"}))
    queue.enqueue(messageId="msg_h", idempotencyKey="k-h")
    enqueued_at = vclock.now
    tick(vclock)
    for n, wait in enumerate((2_000, 4_000, 8_000, 16_000), start=1):
        assert message("msg_h").due_at == vclock.now + wait
        tick(vclock, wait - 1)
        assert sink.count() == n  # not a millisecond early
        tick(vclock, 1)
        assert sink.count() == n + 1
    assert [r.attempt for r in sink.requests] == ["1", "2", "3", "4", "5"]
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 1, "alarmAt": None}
    page = queue.call("listDeadLetters")
    assert page["cursor"] is None and page["hasMore"] is False
    assert page["data"] == [{
        "messageId": "msg_h", "queueName": "__wkf_step_test", "pathname": "step",
        "body": '{"data":"payload"}', "targetBaseUrl": sink.url, "idempotencyKey": "k-h",
        "attempt": 5, "enqueuedAt": enqueued_at, "lastError": "HTTP 500", "failedAt": vclock.now,
    }]
    dead = DeadLetter.objects.get()
    assert dead.dlq_key == f"dlq:{vclock.now:013d}:msg_h"
    assert queue.enqueue(messageId="msg_i", idempotencyKey="k-h")["deduped"] is False


def test_it_caps_the_backoff_at_60_seconds(queue, sink, vclock, settings):
    settings.QUEUE_MAX_ATTEMPTS = "9"
    sink.answer(Answer(500))
    queue.enqueue(messageId="m")
    tick(vclock)
    waits = []
    for _ in range(7):
        row = message("m")
        waits.append(row.due_at - vclock.now)
        tick(vclock, row.due_at - vclock.now)
    assert waits == [2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
    assert sink.count() == 8
    tick(vclock, 60_000)
    assert sink.count() == 9
    assert DeadLetter.objects.get().attempt == 9


def test_it_omits_the_idempotency_key_of_a_dead_letter_that_had_none(queue, sink, vclock):
    fail_five_times(queue, sink, vclock, "nokey")
    row = queue.call("listDeadLetters", {"limit": 10})["data"][0]
    assert "idempotencyKey" not in row and row["lastError"] == "HTTP 500"


def test_it_redrives_a_dead_letter_with_attempts_reset(queue, sink, vclock):
    fail_five_times(queue, sink, vclock, "msg_n", "k-n")
    enqueued_at = DeadLetter.objects.get().enqueued_at
    sink.answer(Answer(200))
    assert queue.call("redriveDeadLetter", "msg_n") == {"ok": True}
    row = message("msg_n")
    assert (row.attempt, row.last_error, row.enqueued_at, row.due_at) == (0, None, enqueued_at, vclock.now)
    assert row.target_base_url == sink.url
    assert queue.stats() == {"pending": 1, "inflight": 0, "deadLetters": 0, "alarmAt": vclock.now + 1}
    assert queue.enqueue(messageId="other", idempotencyKey="k-n")["deduped"] is True  # key held again
    tick(vclock)
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}
    assert sink.requests[-1].message_id == "msg_n" and sink.requests[-1].attempt == "1"


def test_it_refuses_to_redrive_while_a_newer_live_message_holds_the_key(queue, sink, vclock):
    fail_five_times(queue, sink, vclock, "msg_old_dead", "shared-redrive-key")
    assert queue.enqueue(messageId="msg_new_live", idempotencyKey="shared-redrive-key", delaySeconds=60)[
        "deduped"
    ] is False
    assert queue.call("redriveDeadLetter", "msg_old_dead") == {"ok": False}
    assert queue.stats() == {"pending": 1, "inflight": 0, "deadLetters": 1, "alarmAt": vclock.now + 60_000}
    assert list(Message.objects.values_list("message_id", "idempotency_key")) == [
        ("msg_new_live", "shared-redrive-key")
    ]


def test_it_purges_dead_letters(queue, sink, vclock):
    fail_five_times(queue, sink, vclock, "msg_o")
    assert queue.call("purgeDeadLetters") == {"purged": 1}
    assert queue.stats()["deadLetters"] == 0
    assert queue.call("purgeDeadLetters") == {"purged": 0}


# --------------------------------------------------------------------------- delays and alarms (40, 54, 55, 63)


def test_it_honours_delay_seconds_through_the_alarm(queue, sink, vclock):
    queue.enqueue(messageId="msg_d", delaySeconds=42)
    assert queue.stats()["alarmAt"] == vclock.now + 42_000
    tick(vclock)
    tick(vclock, 41_000)
    assert sink.count() == 0
    tick(vclock, 1_500)
    assert sink.count() == 1


def test_it_accepts_fractional_and_negative_delays(queue, sink, vclock):
    start = vclock.now
    queue.enqueue(messageId="frac", delaySeconds=1.5)
    assert message("frac").due_at == start + 1_500
    assert queue.stats()["alarmAt"] == start + 1_500
    queue.enqueue(messageId="neg", delaySeconds=-5)
    assert message("neg").due_at == start
    assert queue.stats()["alarmAt"] == start + 1
    tick(vclock)
    assert [r.message_id for r in sink.requests] == ["neg"]
    tick(vclock, 1_498)
    assert sink.count() == 1
    tick(vclock, 1)
    assert sink.count() == 2


def test_it_rearms_a_wiped_alarm_from_pending_work(queue, sink, vclock):
    queue.enqueue(messageId="msg_p", delaySeconds=60)
    QueueCell.objects.update(alarm_at=None)
    assert queue.call("rearmAlarm") == {"alarmAt": vclock.now + 60_000}


def test_it_rearms_an_overdue_alarm_to_now_plus_one_and_delivers(queue, sink, vclock):
    queue.enqueue(messageId="m")
    QueueCell.objects.update(alarm_at=vclock.now - 1_000)
    assert queue.call("rearmAlarm") == {"alarmAt": vclock.now + 1}
    tick(vclock)
    assert sink.count() == 1
    assert queue.stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_keeps_the_earlier_alarm_when_a_later_message_arrives(queue, sink, vclock):
    queue.enqueue(messageId="a", delaySeconds=10)
    queue.enqueue(messageId="b", delaySeconds=20)
    assert queue.stats()["alarmAt"] == vclock.now + 10_000
    queue.enqueue(messageId="c", delaySeconds=5)
    assert queue.stats()["alarmAt"] == vclock.now + 5_000


def test_it_does_not_fire_an_alarm_before_its_time(queue, sink, vclock):
    queue.enqueue(messageId="m", delaySeconds=1)
    assert machine.fire_due_alarms(vclock.now + 999) == []
    assert len(machine.fire_due_alarms(vclock.now + 1_000)) == 1


def test_it_arms_the_alarm_for_an_in_flight_deadline(queue, sink, vclock, settings):
    settings.QUEUE_CLAIM_LEASE_MS = "330000"  # the protocol's deadline, timeout + 30 s (§7.4; docs/leases.md)
    queue.enqueue(messageId="m")
    vclock.advance(1)
    claims = machine.fire_due_alarms()
    assert [c.message_id for c in claims] == ["m"]
    assert queue.stats() == {"pending": 0, "inflight": 1, "deadLetters": 0, "alarmAt": vclock.now + 330_000}


# --------------------------------------------------------------------------- claims


def test_it_claims_the_earliest_due_messages_first_up_to_the_inflight_cap(queue, sink, vclock):
    for i, delay in enumerate([3, 1, 2, 0, 0, 5, 4]):
        queue.enqueue(messageId=f"m{i}", delaySeconds=delay)
    vclock.advance(10_000)
    claims = machine.fire_due_alarms()
    assert [c.message_id for c in claims] == ["m3", "m4", "m1", "m2", "m0"]
    assert queue.stats()["pending"] == 2 and queue.stats()["inflight"] == 5
    assert queue.stats()["alarmAt"] == vclock.now + 1  # due work waits for a free slot
    assert machine.fire_due_alarms(vclock.now + 1) == []  # saturated: nothing to claim


def test_it_does_not_post_the_same_claim_twice(queue, sink, vclock):
    from queueing.delivery import deliver_claim

    queue.enqueue(messageId="m")
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    assert deliver_claim(claim).result == "acked"
    assert deliver_claim(claim) is None  # a duplicated delivery task
    assert sink.count() == 1


# --------------------------------------------------------------------------- what the client's handler answers (§7.10, §11.11)


def test_it_ignores_retry_after_headers(queue, sink, vclock):
    sink.answer(
        Answer(500, {"error": "boom", "retryAfter": 2}, {"retry-after": "60"}),
        Answer(503, {"timeoutSeconds": 30}, {"retry-after": "1"}),
        Answer(200),
    )
    queue.enqueue(messageId="m")
    tick(vclock)
    assert message("m").due_at == vclock.now + 2_000  # the backoff, not Retry-After
    tick(vclock, 2_000)
    assert message("m").due_at == vclock.now + 30_000  # timeoutSeconds, not Retry-After


def test_it_dead_letters_messages_the_handler_refuses_with_400(queue, sink, vclock):
    fail_five_times(queue, sink, vclock, "refused", "k", Answer(400, {"error": "Unhandled queue"}))
    assert DeadLetter.objects.get().last_error == "HTTP 400"


def test_it_dedups_a_key_routed_to_the_same_shard_of_a_four_shard_queue(queue, sink, vclock):
    assert queue.enqueue(messageId="msg_1", idempotencyKey="k-1", shards=4)["deduped"] is False
    assert queue.enqueue(messageId="msg_2", idempotencyKey="k-1", shards=4) == {
        "ok": True, "messageId": "msg_1", "deduped": True,
    }
