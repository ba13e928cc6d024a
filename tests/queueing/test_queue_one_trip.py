"""The batched and one-round-trip transitions give the states the spec asks for (docs/protocol.md §7.3, §7.4, §7.7, §7.8).

Concurrent enqueues / outcomes of one cell are combined into one transaction
(``queueing.combining``); on PostgreSQL, outside a transaction, the common
cases run as one ``BEGIN; …; COMMIT`` string (``machine._enqueue_in_one_trip``,
``machine._outcomes_in_one_trip``). Every test runs each scenario both ways —
``path="python"`` forces the statement-by-statement path — and checks the
same rows, alarms and answers. On SQLite both are the Python path.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from queueing import machine
from queueing.machine import sql as qsql
from worldcell import sql as executor
from queueing.models import DeadLetter, Message, QueueCell
from queueing.service import parse_enqueue_request
from .support import DEADLINE_MS, enqueue_request
from tests.conftest import is_postgres

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("claim_deadline_of_the_protocol")]

Q = "q:0"


@pytest.fixture(params=["one_trip", "python"])
def path(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(machine.db, "one_trip_enabled", lambda: False)
    elif not is_postgres():
        pytest.skip("one-trip transitions are PostgreSQL's")
    machine._known_cells.clear()
    yield request.param
    machine._known_cells.clear()


@pytest.fixture
def scripts():
    """The one-trip scripts run during the test, with their statements' text."""
    ran: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if sql.startswith("BEGIN;"):
            ran.append(executor.source_text(sql))  # its statements' text (they travel as EXECUTEs)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield ran


def req(mid: str, **over):
    over.setdefault("target", "http://127.0.0.1:1")
    return parse_enqueue_request(enqueue_request(messageId=mid, **over))


def stats():
    return machine.cell_stats(Q)


def pin():
    """The first enqueue creates and pins the cell (always the general path)."""
    assert machine.enqueue(Q, req("pin"))["ok"]
    Message.objects.filter(message_id="pin").delete()
    machine.rearm_alarm(Q)


def test_it_stores_a_batch_with_dedup_and_overwrite_in_arrival_order(vclock, path, scripts):
    pin()
    machine.enqueue(Q, req("live", idempotencyKey="k-live"))
    answers = machine.enqueue_batch(Q, [
        req("a", idempotencyKey="k1"),
        req("b", idempotencyKey="k1"),  # same key as an earlier request of the batch
        req("c", idempotencyKey="k-live"),  # key held by a live message
        req("a", idempotencyKey="k2"),  # same id as an earlier request: overwrites it (upstream quirk)
        req("d", delaySeconds=5),
        req("e", shards=2),  # another shard count
    ])
    assert answers[0] == {"ok": True, "messageId": "a", "deduped": False}
    assert answers[1] == {"ok": True, "messageId": "a", "deduped": True}
    assert answers[2] == {"ok": True, "messageId": "live", "deduped": True}
    assert answers[3] == {"ok": True, "messageId": "a", "deduped": False}
    assert answers[4] == {"ok": True, "messageId": "d", "deduped": False}
    assert answers[5]["code"] == "CONFIG_MISMATCH"
    rows = {m.message_id: m for m in Message.objects.all()}
    assert sorted(rows) == ["a", "d", "live"]
    assert rows["a"].idempotency_key == "k2" and rows["a"].due_at == vclock.now
    assert rows["d"].due_at == vclock.now + 5_000
    assert stats() == {"pending": 3, "inflight": 0, "deadLetters": 0, "alarmAt": vclock.now + 1}
    if path == "one_trip":
        assert scripts and all("INSERT INTO" in s for s in scripts)


@pytest.mark.parametrize("alarm,delay,expected", [
    (None, 0, "now+1"),  # no alarm: now + 1
    (None, 7, "now+7000"),  # a future due time
    ("now-5", 7, "now+1"),  # an overdue alarm moves to now + 1
    ("now+3000", 7, "now+3000"),  # an earlier alarm stays
    ("now+9000", 7, "now+7000"),  # a later one moves earlier
])
def test_it_arms_the_alarm_at_most_the_earliest_due_time(vclock, path, alarm, delay, expected):
    pin()
    at = lambda spec: None if spec is None else vclock.now + int(spec[3:])  # noqa: E731
    QueueCell.objects.filter(name=Q).update(alarm_at=at(alarm))
    machine.enqueue_batch(Q, [req("x", delaySeconds=delay), req("y", delaySeconds=delay + 1)])
    assert stats()["alarmAt"] == at(expected)


def test_it_refuses_another_shard_count_and_learns_a_recreated_cell(vclock, path):
    pin()
    assert machine.enqueue(Q, req("m", shards=3))["code"] == "CONFIG_MISMATCH"
    QueueCell.objects.filter(name=Q).delete()  # an operator removed the cell: ids and pins are gone
    assert machine.enqueue(Q, req("n", shards=3))["ok"]
    assert QueueCell.objects.get(name=Q).queue_shards == 3
    assert machine.enqueue(Q, req("o", shards=3))["ok"]
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["n", "o"]


def _claim_all():
    claims = machine.fire_due_alarms()
    return {c.message_id: (c, machine.start_delivery(c)) for c in claims}


def test_it_acks_and_refills_the_freed_slots_with_started_claims(vclock, path, settings, scripts):
    settings.QUEUE_MAX_INFLIGHT = "2"
    pin()
    machine.enqueue_batch(Q, [req(f"m{i}") for i in range(5)])
    vclock.advance(1)
    claimed = _claim_all()
    assert sorted(claimed) == ["m0", "m1"]
    vclock.advance(10)
    c0, r0 = claimed["m0"]
    c1, r1 = claimed["m1"]
    results = machine.apply_outcomes(c0.cell_id, [
        machine.OutcomeRequest(c0, r0, "ack", claim_next=True),
        machine.OutcomeRequest(c1, r1, "drop", claim_next=1),
    ])
    assert [label for label, _ in results] == ["acked", "dropped"]
    assert [[c.message_id for c in cs] for _, cs in results] == [["m2"], ["m3"]]
    for _, [claim] in results:
        assert claim.started is not None and claim.started.message_id == claim.message_id
        row = Message.objects.get(pk=claim.message_pk)
        assert row.claim_token == claim.token and row.delivery_started_at == vclock.now and row.deliveries == 1
        assert row.inflight_deadline == vclock.now + DEADLINE_MS
    # m4 still waits for a slot: the alarm is due (now + 1), the started claims' deadline later
    assert stats() == {"pending": 1, "inflight": 2, "deadLetters": 0, "alarmAt": vclock.now + 1}
    assert machine.start_delivery(results[0][1][0]) is None  # already started: no second POST
    if path == "one_trip":
        assert any("DELETE FROM" in s for s in scripts)


def test_it_hands_out_unstarted_extra_claims_within_each_cap(vclock, path, settings):
    settings.QUEUE_MAX_INFLIGHT = "5"
    pin()
    machine.enqueue(Q, req("first"))
    vclock.advance(1)
    [(claim, row)] = _claim_all().values()
    machine.enqueue_batch(Q, [req(f"m{i}") for i in range(6)])
    vclock.advance(1)
    [(label, claims)] = machine.apply_outcomes(claim.cell_id, [machine.OutcomeRequest(claim, row, "ack", claim_next=3)])
    assert label == "acked"
    assert [c.message_id for c in claims] == ["m0", "m1", "m2"]
    assert claims[0].started is not None and claims[1].started is None and claims[2].started is None
    assert [machine.start_delivery(c) is not None for c in claims[1:]] == [True, True]
    assert stats()["pending"] == 3 and stats()["inflight"] == 3


def test_it_applies_a_late_ack_and_leaves_the_newer_claim_stale(vclock, path):
    pin()
    machine.enqueue(Q, req("m", idempotencyKey="k"))
    vclock.advance(1)
    [(old, old_row)] = _claim_all().values()
    vclock.advance(DEADLINE_MS)
    [(new, new_row)] = _claim_all().values()  # recovered and claimed again
    [(label, claims)] = machine.apply_outcomes(old.cell_id, [machine.OutcomeRequest(old, old_row, "ack", claim_next=True)])
    assert (label, claims) == ("acked", [])
    assert not Message.objects.exists()
    [(label, claims)] = machine.apply_outcomes(new.cell_id, [machine.OutcomeRequest(new, new_row, "ack", claim_next=True)])
    assert (label, claims) == ("stale", [])
    assert stats() == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_recovers_lost_claims_in_the_outcome_transaction(vclock, path, settings):
    settings.QUEUE_MAX_INFLIGHT = "2"
    pin()
    machine.enqueue_batch(Q, [req("lost"), req("live")])
    vclock.advance(1)
    claimed = _claim_all()
    lost, _ = claimed["lost"]
    Message.objects.filter(pk=lost.message_pk).update(inflight_deadline=vclock.now + 5)  # a short-lived claim
    vclock.advance(10)
    live, live_row = claimed["live"]
    [(label, claims)] = machine.apply_outcomes(live.cell_id, [machine.OutcomeRequest(live, live_row, "ack", claim_next=True)])
    assert label == "acked"
    assert [c.message_id for c in claims] == ["lost"]  # recovered, then claimed again
    assert claims[0].started.attempt == 0  # a lost claim is not a counted attempt
    assert stats() == {"pending": 0, "inflight": 1, "deadLetters": 0, "alarmAt": vclock.now + DEADLINE_MS}


def test_it_mixes_acks_retries_redeliveries_and_dead_letters_in_one_batch(vclock, path, settings):
    settings.QUEUE_MAX_INFLIGHT = "4"
    settings.QUEUE_MAX_ATTEMPTS = "2"
    pin()
    machine.enqueue_batch(Q, [req(m) for m in ("ack", "retry", "later", "dead")])
    Message.objects.filter(message_id="dead").update(attempt=1)
    vclock.advance(1)
    claimed = _claim_all()
    vclock.advance(5)
    reqs = [
        machine.OutcomeRequest(*claimed["ack"], "ack", claim_next=True),
        machine.OutcomeRequest(*claimed["retry"], "retry", status=500, reason="HTTP 500", claim_next=True),
        machine.OutcomeRequest(*claimed["later"], "redeliver", status=503, timeout_seconds=30, claim_next=True),
        machine.OutcomeRequest(*claimed["dead"], "retry", status=502, reason="HTTP 502", claim_next=True),
    ]
    dead_row = claimed["dead"][1]
    reqs[3] = machine.OutcomeRequest(reqs[3].claim, machine.DeliveryRow(
        dead_row.message_id, dead_row.queue_name, dead_row.pathname, dead_row.body, dead_row.target_base_url,
        dead_row.idempotency_key, 1, dead_row.enqueued_at, dead_row.deliveries), "retry", 502, "HTTP 502", None, True)
    results = machine.apply_outcomes(reqs[0].claim.cell_id, reqs)
    assert [label for label, _ in results] == ["acked", "retry scheduled", "redelivery scheduled", "dead-lettered"]
    rows = {m.message_id: m for m in Message.objects.all()}
    assert (rows["retry"].attempt, rows["retry"].last_error, rows["retry"].due_at) == (1, "HTTP 500", vclock.now + 2_000)
    assert (rows["later"].attempt, rows["later"].due_at) == (0, vclock.now + 30_000)
    assert DeadLetter.objects.get().message_id == "dead"
    assert stats() == {"pending": 2, "inflight": 0, "deadLetters": 1, "alarmAt": vclock.now + 2_000}


def test_it_commits_nothing_of_a_one_trip_script_that_fails_midway(vclock, path):
    pin()
    machine.enqueue(Q, req("m"))
    vclock.advance(1)
    [(claim, row)] = _claim_all().values()
    machine.enqueue(Q, req("next"))

    # the scheduleNextAlarm statement, the last before COMMIT (a prepared EXECUTE on the wire)
    alarm, n_params = executor.script_statements(qsql.one_trip_outcomes(0, 1, 1))[-2]
    assert alarm.startswith('WITH "nx"')
    alarm_on_wire = executor.execute_text(alarm)
    failing = "SELECT 1 / 0, " + ", ".join(["%s"] * n_params)

    def break_the_alarm_statement(execute, sql, params, many, context):
        # the scheduleNextAlarm statement (after the ack and the claim) now divides by zero
        if sql.startswith("BEGIN;"):
            sent = alarm_on_wire if alarm_on_wire in sql else alarm  # as text past the per-connection cap
            assert sent in sql
            sql = sql.replace(sent, failing)
        elif '"alarm_at" = %s' in sql and sql.startswith('UPDATE "queueing_queuecell"'):
            raise RuntimeError("injected")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(break_the_alarm_statement):
        with pytest.raises(Exception):
            machine.apply_outcomes(claim.cell_id, [machine.OutcomeRequest(claim, row, "ack", claim_next=True)])
    row_now = Message.objects.get(message_id="m")
    assert row_now.claim_token == claim.token  # not acked
    assert Message.objects.get(message_id="next").claim_token is None  # not claimed
    [(label, claims)] = machine.apply_outcomes(claim.cell_id, [machine.OutcomeRequest(claim, row, "ack", claim_next=True)])
    assert label == "acked" and [c.message_id for c in claims] == ["next"]


def test_it_keeps_the_inflight_cap_under_concurrent_enqueues_and_outcomes(path, settings):
    """Real clock, 8 threads enqueueing and 4 delivering by hand: never more than the cap in flight."""
    settings.QUEUE_MAX_INFLIGHT = "3"
    pin()
    stop = threading.Event()
    peak = [0]
    delivered: list[str] = []
    lock = threading.Lock()

    def producer(p):
        try:
            for i in range(25):
                machine.enqueue(Q, req(f"p{p}-{i}"))
        finally:
            connection.close()

    def deliverer(_):
        try:
            claims = []
            while not stop.is_set():
                if not claims:
                    claims = machine.fire_cell_alarm(Q, early_ms=1, skip_locked=True)
                    claims = [c for c in claims]
                    if not claims:
                        continue
                claim = claims.pop(0)
                row = claim.started or machine.start_delivery(claim)
                if row is None:
                    continue
                with lock:
                    delivered.append(claim.message_id)
                    peak[0] = max(peak[0], machine.cell_stats(Q)["inflight"])
                _, more = machine.apply_outcome(claim, row, "ack", claim_next=True)
                claims = more + claims
        finally:
            connection.close()

    with ThreadPoolExecutor(12) as ex:
        workers = [ex.submit(deliverer, i) for i in range(4)]
        list(ex.map(producer, range(8)))
        for _ in range(400):
            if len(delivered) >= 200:
                break
            threading.Event().wait(0.05)
        stop.set()
        for w in workers:
            w.result()
    assert sorted(delivered) == sorted(f"p{p}-{i}" for p in range(8) for i in range(25))
    assert peak[0] <= 3
    assert not Message.objects.exists()


def test_it_claims_a_503_redelivery_due_now_in_the_same_transaction(vclock, path):
    pin()
    machine.enqueue(Q, req("m", idempotencyKey="k"))
    vclock.advance(1)
    [(claim, row)] = _claim_all().values()
    vclock.advance(3)
    [(label, [again])] = machine.apply_outcomes(claim.cell_id, [
        machine.OutcomeRequest(claim, row, "redeliver", status=503, timeout_seconds=0, claim_next=True)
    ])
    assert label == "redelivery scheduled"
    assert again.message_id == "m" and again.started is not None and again.token != claim.token
    assert (again.started.attempt, again.started.deliveries) == (0, 2)  # not counted; the second POST
    stored = Message.objects.get()
    assert (stored.attempt, stored.last_status, stored.inflight_deadline) == (0, 503, vclock.now + DEADLINE_MS)
    [(label, none)] = machine.apply_outcomes(claim.cell_id, [
        machine.OutcomeRequest(again, again.started, "retry", status=500, reason="HTTP 500", claim_next=True)
    ])
    assert (label, none) == ("retry scheduled", [])
    stored = Message.objects.get()
    assert (stored.attempt, stored.last_error, stored.due_at) == (1, "HTTP 500", vclock.now + 2_000)
    assert stats() == {"pending": 1, "inflight": 0, "deadLetters": 0, "alarmAt": vclock.now + 2_000}


@pytest.mark.postgres_only  # prepared statements are PostgreSQL's
def test_it_enqueues_and_acks_once_when_its_prepared_statements_vanish(vclock, path, scripts):
    """A pooler's ``DISCARD ALL`` (here ``DEALLOCATE ALL``) between scripts: each runs once, in full."""
    pin()
    machine.enqueue(Q, req("m"))
    vclock.advance(1)
    [(claim, row)] = _claim_all().values()
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    assert machine.enqueue(Q, req("next")) == {"ok": True, "messageId": "next", "deduped": False}
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    [(label, claims)] = machine.apply_outcomes(claim.cell_id, [machine.OutcomeRequest(claim, row, "ack", claim_next=True)])
    assert label == "acked" and [c.message_id for c in claims] == ["next"]
    assert sorted(Message.objects.values_list("message_id", flat=True)) == ["next"]
    if path == "one_trip":
        assert any("INSERT INTO" in s for s in scripts) and any("DELETE FROM" in s for s in scripts)
