"""The queue rules that exist twice — Python for the statement-by-statement path, SQL for the
one-trip scripts (docs/decisions.md "Queue rules written once") — give identical results on
generated inputs (PostgreSQL; SQLite has only the Python path).

* rule level: ``machine.lock.soon`` / ``next_alarm`` / ``armed`` against the SQL fragments
  ``machine.sql.soon`` / ``armed`` that the one-trip scripts embed, evaluated by PostgreSQL;
* transition level: generated cell states (pending and in-flight messages, lost claims, attempt
  counts) get the same generated delivery outcomes once through ``_outcomes_in_one_trip`` and
  once through the Python path, on two identical cells; labels, claims, every message row, the
  dead letters and the alarm must come out the same — and so must the attempt log (rows written,
  the per-message cap, attempts cleared by an ack) and the per-minute outcome counters
  (``queueing.attempt_log``, whose SQL both paths run with a different "applied" test).
"""
from __future__ import annotations

import uuid

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueing import attempt_log, config, machine
from queueing.machine import db, lock, sql
from queueing.models import DeadLetter, DeliveryAttempt, Message, OutcomeMinute, QueueCell

from .support import VirtualClock

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

NOW = 1_767_323_045_678
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: times near ``now`` (the boundaries of every rule) and far from it
near = st.integers(-3, 3).map(lambda d: NOW + d)
times = st.one_of(near, st.integers(0, 10**13 - 1), st.integers(-400_000, 400_000).map(lambda d: NOW + d))
maybe_times = st.one_of(st.none(), times)


def evaluate(statement: str, params: list) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


def soon_params(now: int) -> list[int]:
    return [now, now + config.MIN_ALARM_DELAY_MS]


# --------------------------------------------------------------------------- rule level


@HYPOTHESIS
@given(first_due=maybe_times, first_deadline=maybe_times, now=near)
def test_schedule_next_alarm_is_the_same_in_python_and_sql(first_due, first_deadline, now):
    statement = f'SELECT {sql.soon(X_N)} FROM (SELECT LEAST(CAST(%s AS BIGINT), CAST(%s AS BIGINT)) AS "n") AS "x"'
    assert evaluate(statement, [*soon_params(now), first_due, first_deadline]) == lock.next_alarm(
        first_due, first_deadline, now
    )


@HYPOTHESIS
@given(current=maybe_times, target=times, now=near)
def test_arm_alarm_at_most_is_the_same_in_python_and_sql(current, target, now):
    statement = (
        f'SELECT {sql.armed(V_CUR, V_T)} FROM (SELECT "w"."cur", {sql.soon(W_TT)} AS "t" '
        'FROM (SELECT CAST(%s AS BIGINT) AS "cur", CAST(%s AS BIGINT) AS "tt") AS "w") AS "v"'
    )
    assert evaluate(statement, [*soon_params(now), *soon_params(now), current, target]) == lock.armed(
        current, target, now
    )


X_N = '"x"."n"'
V_CUR = '"v"."cur"'
V_T = '"v"."t"'
W_TT = '"w"."tt"'


# --------------------------------------------------------------------------- transition level

pending = st.fixed_dictionaries({"kind": st.just("pending"), "due": st.integers(-5_000, 5_000),
                                 "attempt": st.integers(0, 4), "logged": st.sampled_from([0, 2])})
in_flight = st.fixed_dictionaries({
    "kind": st.just("inflight"), "deadline": st.integers(-2_000, 400_000), "started": st.booleans(),
    # below QUEUE_MAX_ATTEMPTS - 1: a retry stays on the one-trip path (a dead letter takes the
    # general path, which hands claims to other delivery threads; see docs/decisions.md)
    "attempt": st.integers(0, config.DEFAULT_MAX_ATTEMPTS - 2),
    # attempts already in the log: none, a few, the cap (a new one must push the oldest out)
    "logged": st.sampled_from([0, 3, attempt_log.KEEP_PER_MESSAGE]),
})
outcome = st.fixed_dictionaries({
    "kind": st.sampled_from(["ack", "drop", "redeliver", "retry"]),
    "timeout": st.sampled_from([0, 1, -1, 0.5, 5, 120]),
    "status": st.sampled_from([500, 503, None]),
    "claim_next": st.sampled_from([True, 1, 2, 3]),
    "queue": st.sampled_from(["__wkf_step_a", "__wkf_workflow_b"]),
    "head": st.sampled_from([None, b"", b'{"error":"down"}', b"\x00\xff" + b"x" * 600]),
    "may_have_log": st.booleans(),
    "record": st.booleans(),
})


@st.composite
def cell_states(draw):
    messages = draw(st.lists(st.one_of(pending, in_flight), min_size=1, max_size=7))
    # outcomes for some current claims (deadline not passed: a claim whose own deadline passed is
    # recovered first by the one-trip script and stale there, see docs/decisions.md)
    current = [i for i, m in enumerate(messages) if m["kind"] == "inflight" and m["deadline"] > 0]
    chosen = draw(st.lists(st.sampled_from(current), unique=True, min_size=1, max_size=len(current))) if current else []
    return messages, [(i, draw(outcome)) for i in chosen]


def build(name: str, messages: list[dict]) -> tuple[QueueCell, list[Message]]:
    cell = QueueCell.objects.create(name=name, queue_shards=1, pinned_at=NOW - 10_000, alarm_at=NOW)
    rows = []
    for i, m in enumerate(messages):
        fields = dict(
            cell=cell, message_id=f"m{i}", queue_name="__wkf_step_t", pathname="step", body='"{}"',
            target_base_url="http://127.0.0.1:1", attempt=m["attempt"], enqueued_at=NOW - 60_000,
            updated_at=NOW - 1_000, deliveries=m["attempt"],
        )
        if m["kind"] == "pending":
            fields.update(due_at=NOW + m["due"])
        else:
            fields.update(inflight_deadline=NOW + m["deadline"], claim_token=f"tok{i}",
                          delivery_started_at=NOW - 500 if m["started"] else None)
        rows.append(Message.objects.create(**fields))
        DeliveryAttempt.objects.bulk_create(
            DeliveryAttempt(cell_id=cell.pk, message_id=f"m{i}", attempt=k + 1, started_at=NOW - 9_000 + k,
                            duration_ms=k, status=500, error="HTTP 500", answer_head="old", result="retry scheduled")
            for k in range(m["logged"])
        )
    return cell, rows


def requests_for(cell: QueueCell, rows: list[Message], outcomes) -> list[machine.OutcomeRequest]:
    out = []
    for i, o in outcomes:
        m = rows[i]
        claim = machine.Claim(cell.name, cell.pk, m.pk, m.message_id, m.claim_token)
        row = machine.DeliveryRow(m.message_id, m.queue_name, m.pathname, "{}", m.target_base_url, None,
                                  m.attempt, m.enqueued_at, m.deliveries)
        kind = o["kind"]
        out.append(machine.OutcomeRequest(
            claim, row, kind, status=o["status"] if kind != "redeliver" else 503,
            reason="HTTP 500" if kind == "retry" else None,
            timeout_seconds=o["timeout"] if kind == "redeliver" else None, claim_next=o["claim_next"],
            attempt=attempt_log.AttemptRecord(
                o["queue"], m.attempt + 1, NOW - 400, 37, o["status"], "HTTP 500" if kind == "retry" else None,
                o["head"], o["may_have_log"],
            ) if o["record"] else None,
        ))
    return out


def snapshot(cell: QueueCell) -> dict:
    cell.refresh_from_db()
    rows = {
        m.message_id: (m.due_at, m.inflight_deadline, m.claim_token is None, m.delivery_started_at, m.attempt,
                       m.deliveries, m.last_error, m.last_status, m.last_attempt_at, m.updated_at)
        for m in Message.objects.filter(cell=cell)
    }
    dead = sorted((d.message_id, d.attempt, d.last_error, d.last_status, d.failed_at)
                  for d in DeadLetter.objects.filter(cell=cell))
    attempts = [
        (a.message_id, a.attempt, a.started_at, a.duration_ms, a.status, a.error, a.answer_head, a.result)
        for a in DeliveryAttempt.objects.filter(cell_id=cell.pk).order_by("id")
    ]
    minutes = sorted(
        OutcomeMinute.objects.filter(cell_id=cell.pk)
        .values_list("queue_name", "minute", "delivered", "dropped", "retried", "dead_lettered")
    )
    return {"alarm": cell.alarm_at, "messages": rows, "dead": dead, "attempts": attempts, "minutes": minutes}


def answers(results) -> list:
    return [(label, [(c.message_id, c.started is not None) for c in claims]) for label, claims in results]


@HYPOTHESIS
@given(state=cell_states())
def test_outcomes_in_one_trip_equal_the_python_path_on_generated_cell_states(state, monkeypatch):
    messages, outcomes = state
    clock = VirtualClock(NOW).install()
    tag = uuid.uuid4().hex[:8]
    try:
        one_cell, one_rows = build(f"q:one-{tag}", messages)
        py_cell, py_rows = build(f"q:py-{tag}", messages)
        assert db.one_trip_enabled()
        one = machine.apply_outcomes(one_cell.pk, requests_for(one_cell, one_rows, outcomes))
        with monkeypatch.context() as m:
            m.setattr(db, "one_trip_enabled", lambda: False)
            py = machine.apply_outcomes(py_cell.pk, requests_for(py_cell, py_rows, outcomes))
        assert answers(one) == answers(py)
        assert snapshot(one_cell) == snapshot(py_cell)
    finally:
        clock.uninstall()
        ids = list(QueueCell.objects.filter(name__endswith=tag).values_list("pk", flat=True))
        DeliveryAttempt.objects.filter(cell_id__in=ids).delete()
        OutcomeMinute.objects.filter(cell_id__in=ids).delete()
        QueueCell.objects.filter(name__endswith=tag).delete()
