"""Claim leases (docs/leases.md; claims: docs/protocol.md §7.4, §7.7).

The lease arithmetic (``lease.renewed_deadline``) and its SQL restatement
(``lease.renew_claims``) run on the same generated inputs; the renewer is
compare-and-set on the claim token; a failed renewal extends nothing while the
outcome still applies; a live pump keeps a delivery longer than the lease
exactly once, and a dead one's claim is redelivered once the lease lapses.
"""
from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from queueing import delivery, lease, machine
from queueing.models import Message
from queueing.pump import LocalPump
from queueing.service import QueueCell
from .support import Answer, enqueue_request

Q = "q:0"
NOW = 1_767_323_045_678  # where the ``vclock`` fixture starts


# --------------------------------------------------------------------------- arithmetic


def test_it_gives_a_fresh_claim_one_lease_but_never_more_than_the_protocol_deadline(settings):
    assert lease.claim_lease_ms() == 10_000  # the default
    assert lease.first_deadline(NOW) == NOW + 10_000
    settings.QUEUE_CLAIM_LEASE_MS = "2500ms"  # parseInt rules, as every QUEUE_* setting (§7.2)
    assert lease.first_deadline(NOW) == NOW + 2_500
    settings.QUEUE_CLAIM_LEASE_MS = "0"
    assert lease.claim_lease_ms() == 10_000
    settings.QUEUE_CLAIM_LEASE_MS = "999999999"
    assert lease.first_deadline(NOW) == NOW + 300_000 + 30_000  # capped at timeout + 30 s
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "1000"
    assert lease.lease_cap_ms() == 31_000
    assert lease.first_deadline(NOW) == NOW + 31_000


@pytest.mark.parametrize(
    "now,started,current,expected",
    [
        (NOW, NOW - 1_000, NOW + 5_000, NOW + 10_000),  # renewed to now + lease
        (NOW, None, NOW + 5_000, None),  # POST not begun: not renewed
        (NOW, NOW - 1_000, NOW, None),  # lease lapsed (deadline ≤ now): lost, not renewed
        (NOW, NOW - 1_000, NOW - 1, None),
        (NOW, NOW - 1_000, NOW + 10_000, None),  # already there: no write
        (NOW, NOW - 1_000, NOW + 20_000, None),  # never shortened
        (NOW, NOW - 325_000, NOW + 1_000, NOW + 5_000),  # capped at start + timeout + 30 s
        (NOW, NOW - 330_000, NOW + 1, None),  # at the cap: never beyond
    ],
)
def test_it_computes_the_renewed_deadline(now, started, current, expected):
    assert lease.renewed_deadline(now, started, current, 10_000, 330_000) == expected


@pytest.mark.django_db
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    offset=st.integers(-400_000, 400_000),
    started=st.one_of(st.none(), st.integers(-400_000, 0)),
    lease_ms=st.integers(1, 400_000),
    timeout_ms=st.integers(1, 400_000),
)
def test_it_renews_in_sql_exactly_as_the_python_rule_says(offset, started, lease_ms, timeout_ms):
    cell = QueueCell(Q)
    if not Message.objects.exists():
        cell.enqueue(enqueue_request(messageId="m"))
    current = NOW + offset
    started_at = None if started is None else NOW + started
    Message.objects.update(inflight_deadline=current, claim_token="tok", delivery_started_at=started_at, due_at=None)
    pk = Message.objects.get().pk
    with override_settings(QUEUE_CLAIM_LEASE_MS=str(lease_ms), QUEUE_DELIVERY_TIMEOUT_MS=str(timeout_ms)):
        renewed = lease.renew_claims([(pk, "tok")], now=NOW)
        expected = lease.renewed_deadline(NOW, started_at, current, lease_ms, timeout_ms + 30_000)
    stored = Message.objects.get().inflight_deadline
    assert stored == (current if expected is None else expected)
    assert renewed == ([] if expected is None else [pk])


# --------------------------------------------------------------------------- compare-and-set


def claimed(vclock, message_id="m", **over):
    QueueCell(Q).enqueue(enqueue_request(messageId=message_id, **over))
    vclock.advance(1)
    [claim] = machine.fire_due_alarms()
    assert machine.start_delivery(claim) is not None
    return claim


@pytest.mark.django_db
def test_a_renewal_of_a_lost_claim_does_nothing(vclock):
    claim = claimed(vclock)
    assert Message.objects.get().inflight_deadline == vclock.now + 10_000
    vclock.advance(3_000)
    # the claim was recovered and claimed again by someone else: its token changed
    Message.objects.update(claim_token="someone-else")
    renewer = lease.LeaseRenewer()
    renewer.hold(claim)
    assert renewer.renew_now() == []
    assert Message.objects.get().inflight_deadline == vclock.now - 3_000 + 10_000
    Message.objects.update(claim_token=claim.token)  # ours again: renewed
    assert renewer.renew_now() == [claim.message_pk]
    assert Message.objects.get().inflight_deadline == vclock.now + 10_000


@pytest.mark.django_db
def test_a_released_claim_is_no_longer_renewed_and_a_lapsed_lease_stays_lost(vclock):
    claim = claimed(vclock)
    renewer = lease.LeaseRenewer()
    renewer.hold(claim)
    renewer.release(claim)
    vclock.advance(3_000)
    assert renewer.renew_now() == []
    renewer.hold(claim)
    vclock.advance(7_000)  # deadline == now: lapsed
    assert renewer.renew_now() == []
    assert Message.objects.get().inflight_deadline == vclock.now


@pytest.mark.django_db
def test_a_failed_renewal_extends_nothing_and_the_outcome_still_applies_while_the_claim_is_ours(vclock, sink):
    claim = claimed(vclock, target=sink.url)
    before = Message.objects.get().inflight_deadline
    renewer = lease.LeaseRenewer()
    renewer.hold(claim)
    vclock.advance(3_000)

    def unreachable(execute, sql, params, many, context):
        if "inflight_deadline" in sql and sql.startswith('UPDATE "queueing_message" SET "inflight_deadline"'):
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(unreachable):
        with pytest.raises(OperationalError):
            renewer.renew_now()
    assert Message.objects.get().inflight_deadline == before
    # nobody recovered it: the delivery's outcome is applied (compare-and-set on the token)
    report = delivery.deliver_claim(
        machine.Claim(claim.cell_name, claim.cell_id, claim.message_pk, claim.message_id, claim.token,
                      started=_row_of(claim)),
    )
    assert report is not None and report.result == "acked"
    assert not Message.objects.exists()


def _row_of(claim):
    m = Message.objects.get(pk=claim.message_pk)
    return machine.DeliveryRow(m.message_id, m.queue_name, m.pathname, m.body_text, m.target_base_url,
                               m.idempotency_key, m.attempt, m.enqueued_at, m.deliveries)


@pytest.mark.django_db
def test_a_holder_whose_lease_lapsed_and_was_recovered_is_refused_the_retry(vclock, sink):
    sink.answer(Answer(500))
    claim = claimed(vclock, target=sink.url)
    row = _row_of(claim)
    vclock.advance(10_000)  # lapsed, and the next alarm recovers it
    assert machine.fire_due_alarms() != []  # re-claimed under a new token
    assert machine.apply_outcome(claim, row, "retry", status=500, reason="HTTP 500") == "stale"
    assert Message.objects.get().attempt == 0


# --------------------------------------------------------------------------- a live pump renews


def _free(pump: LocalPump):
    pump.stop(5)


@pytest.mark.django_db(transaction=True)
def test_a_live_pump_keeps_a_delivery_longer_than_its_lease_exactly_once(settings, sink):
    settings.QUEUE_CLAIM_LEASE_MS = "600"  # renewed every 200 ms
    gate = threading.Event()
    sink.script(lambda rec: (gate.wait(10), Answer(200))[1])
    pumps = [LocalPump(interval_s=0.02, max_workers=4, register=i == 0).start() for i in range(2)]
    try:
        QueueCell(Q).enqueue(enqueue_request(messageId="slow", target=sink.url))
        pumps[0].wake(Q)
        assert sink.wait_for(1, 10)
        time.sleep(2.5)  # four leases: the other pump fires the cell's alarm repeatedly meanwhile
        assert sink.count() == 1
        assert pumps[0].leases.renewals + pumps[1].leases.renewals >= 5
        gate.set()
        deadline = time.monotonic() + 10
        while Message.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Message.objects.exists()
        assert sink.count() == 1
    finally:
        gate.set()
        for p in pumps:
            _free(p)


@pytest.mark.django_db(transaction=True)
def test_a_dead_pumps_claim_is_redelivered_once_its_lease_lapses(settings, sink):
    settings.QUEUE_CLAIM_LEASE_MS = "800"
    gate = threading.Event()
    seen: list[float] = []

    def script(rec):
        seen.append(time.monotonic())
        if len(seen) == 1:
            gate.wait(10)  # the first holder never answers in time
        return Answer(200)

    sink.script(script)
    dying = LocalPump(interval_s=0.02, max_workers=2, register=False).start()
    dying.leases.stop()  # its renewer is dead: as if the process had been killed
    QueueCell(Q).enqueue(enqueue_request(messageId="orphan", target=sink.url))
    dying.wake(Q)
    try:
        assert sink.wait_for(1, 10)
        live = LocalPump(interval_s=0.02, max_workers=2, register=False).start()
        try:
            assert sink.wait_for(2, 10)
            assert 0.6 <= seen[1] - seen[0] < 2.5, seen  # one lease (800 ms) after the POST began
            assert [r.attempt for r in sink.requests] == ["1", "1"]  # a lost claim is not a counted attempt
        finally:
            gate.set()
            _free(live)
    finally:
        gate.set()
        _free(dying)
