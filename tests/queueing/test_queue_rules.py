"""The queue rules that exist twice — Python for the statement-by-statement path, SQL for the
one-trip scripts (docs/decisions.md "Queue rules written once") — give identical results on
generated inputs (PostgreSQL; SQLite has only the Python path).

* rule level: ``machine.lock.soon`` / ``next_alarm`` / ``armed`` against the SQL fragments
  ``machine.sql.soon`` / ``armed`` that the one-trip scripts embed, evaluated by PostgreSQL;
* enqueue: generated batches get the same answers, rows and flow records through
  ``_enqueue_in_one_trip`` (the fence and the record restated in SQL) and the general path;
* transition level: generated cell states (pending and in-flight messages, lost claims, attempt
  counts) get the same generated delivery outcomes once through ``_outcomes_in_one_trip`` and
  once through the Python path, on two identical cells; labels, claims, every message row, the
  dead letters and the alarm must come out the same — and so must the attempt log (rows written,
  the per-message cap, attempts cleared by an ack) and the per-minute outcome counters
  (``queueing.attempt_log``, whose SQL both paths run with a different "applied" test).
"""
from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cells.models import FlowMessageRecord, RunTombstone
from queueing import attempt_log, config, machine
from worldcell import codec
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


# --------------------------------------------------------------------------- enqueue: the fence and the flow record
#
# The one-trip enqueue restates two rules in SQL: a message of a run that has a tombstone is
# refused (``RUN_EXPIRED``, docs/lifecycle.md §3), and a stored workflow message becomes its run's
# ``FlowMessageRecord``, the last stored one of a batch winning (docs/lifecycle.md "Stuck-run
# repair"). Generated batches (repeated ids and keys, flow and step messages, runs with and without
# a tombstone) go once through the one-trip script and once through the general path, each on its
# own cell and its own run ids; answers, message rows and records must come out the same.

RUNS = ("r0", "r1", "r2")
enqueue_item = st.fixed_dictionaries({
    "mid": st.sampled_from(["a", "b", "c", "d"]),
    "key": st.sampled_from([None, None, "k1", "k2"]),
    "run": st.sampled_from(RUNS + (None,)),
    "flow": st.booleans(),
    "delay": st.sampled_from([None, 0, 3]),
})


def enqueue_requests(items: list[dict], prefix: str) -> list[machine.EnqueueRequest]:
    from queueing.service import parse_enqueue_request

    out = []
    for n, it in enumerate(items):
        run = f"{prefix}{it['run']}" if it["run"] else None
        member = "runId" if it["flow"] else "workflowRunId"
        body = json.dumps({member: run, "n": n}) if run else json.dumps({"n": n})
        wire = {"messageId": it["mid"], "queueName": "__wkf_workflow_t" if it["flow"] else "__wkf_step_t",
                "pathname": "flow" if it["flow"] else "step", "body": body,
                "config": {"targetBaseUrl": "http://127.0.0.1:1", "queueShards": 1}}
        if it["key"]:
            wire["idempotencyKey"] = it["key"]
        if it["delay"] is not None:
            wire["delaySeconds"] = it["delay"]
        out.append(parse_enqueue_request(wire))
    return out


def enqueue_snapshot(cell_name: str, prefix: str) -> dict:
    rows = {m.message_id: (m.idempotency_key, m.due_at, m.body, m.run_id and m.run_id.removeprefix(prefix),
                           m.attempt)
            for m in Message.objects.filter(cell__name=cell_name)}
    records = {r.run_id.removeprefix(prefix): (r.queue_cell == cell_name, r.queue_name, r.pathname,
                                               r.body.replace(prefix, ""), r.queue_shards, r.recorded_at)
               for r in FlowMessageRecord.objects.filter(run_id__startswith=prefix)}
    alarm = QueueCell.objects.get(name=cell_name).alarm_at
    return {"messages": {k: (*v[:2], v[2].replace(prefix, ""), *v[3:]) for k, v in rows.items()},
            "records": records, "alarm": alarm}


def repeats(items: list[dict]) -> bool:
    """Whether a request repeats an earlier one's message id or idempotency key (``enqueue_batch``)."""
    seen: set = set()
    for it in items:
        names = {("id", it["mid"])} | ({("key", it["key"])} if it["key"] else set())
        if names & seen:
            return True
        seen |= names
    return False


def normalised(answers: list[dict], prefix: str) -> list[dict]:
    return [{k: (v.replace(prefix, "") if isinstance(v, str) else v) for k, v in a.items()} for a in answers]


@HYPOTHESIS
@given(items=st.lists(enqueue_item, min_size=1, max_size=6), expired=st.sets(st.sampled_from(RUNS)),
       recorded=st.sets(st.sampled_from(RUNS)))
def test_enqueue_in_one_trip_fences_and_records_like_the_general_path(items, expired, recorded, monkeypatch):
    clock = VirtualClock(NOW).install()
    tag = uuid.uuid4().hex[:8]
    results = {}
    try:
        for path in ("one", "py"):
            prefix = f"{path}-{tag}-"
            cell_name = f"q:{prefix}"
            for run in expired:
                when = codec.from_epoch_ms(NOW - 86_400_000)
                RunTombstone.objects.create(run_id=prefix + run, workflow_name="w", deployment_id="d",
                                            status="completed", created_at=when, updated_at=when,
                                            expired_at=when, tombstoned_at=when, reason="manual")
            for run in recorded:  # an earlier workflow message of the run: replaced when a new one is stored
                FlowMessageRecord.objects.create(run_id=prefix + run, queue_cell="q:old", queue_name="__wkf_workflow_t",
                                                 pathname="flow", body='"old"', target_base_url="http://old",
                                                 queue_shards=1, recorded_at=NOW - 5)
            machine._known_cells.clear()
            for _ in range(2):  # creates and pins the cell, then learns it pinned (the general path, both times)
                assert machine.enqueue(cell_name, enqueue_requests([{"mid": "pin", "key": None, "run": None,
                                                                     "flow": False, "delay": None}], prefix)[0])["ok"]
            Message.objects.filter(cell__name=cell_name, message_id="pin").delete()
            machine.rearm_alarm(cell_name)
            requests = enqueue_requests(items, prefix)
            with monkeypatch.context() as m:
                if path == "py":
                    m.setattr(db, "one_trip_enabled", lambda: False)
                else:
                    assert db.one_trip_enabled() and cell_name in machine._known_cells
                answers = machine.enqueue_batch(cell_name, requests)
            results[path] = (normalised(answers, prefix), enqueue_snapshot(cell_name, prefix))
        one, py = results["one"], results["py"]
        assert one[0] == py[0] and one[1]["messages"] == py[1]["messages"] and one[1]["alarm"] == py[1]["alarm"]
        if not repeats(items):
            assert one[1]["records"] == py[1]["records"]
        else:
            # a request repeating an earlier one's id or key is left to the general path, after the
            # script: the record is then the last stored as applied, one of the run's stored ones
            assert one[1]["records"].keys() == py[1]["records"].keys()
            for run, record in one[1]["records"].items():
                stored = {py[1]["messages"][a["messageId"]][2] for a, it in zip(py[0], items)
                          if it["run"] == run and it["flow"] and a.get("ok") and not a["deduped"]}
                assert record[3] in stored or record == py[1]["records"][run]
        for answer, it in zip(results["one"][0], items):  # the fence refuses exactly the expired runs' messages
            assert (answer.get("code") == "RUN_EXPIRED") == (it["run"] in expired)
    finally:
        clock.uninstall()
        machine._known_cells.clear()
        QueueCell.objects.filter(name__contains=tag).delete()
        RunTombstone.objects.filter(run_id__contains=tag).delete()
        FlowMessageRecord.objects.filter(run_id__contains=tag).delete()
