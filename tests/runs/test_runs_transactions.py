"""How ``applyEvent`` talks to the database (cells.run_store.LockedRunCell, worldcell.sql).

Over the RPC route on PostgreSQL the connection is in autocommit mode, so
``applyEvent`` carries ``BEGIN`` in the query string that locks the cell and
reads it, and ``COMMIT`` in the one that writes: two round trips per event,
every statement a prepared one. These tests run outside any test transaction
(``transaction=True``) to exercise exactly that path; on SQLite they cover the
ordinary ``atomic()`` path.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction
from django.test import Client

from cells import event_machine, faults
from cells.event_machine import format_event_id
from cells.models import Event, RunCellState, Step
from cells.run_store import LockedRunCell
from worldcell import sql as storage
from cells.runs import RunCell

from tests.conftest import RpcClient, is_postgres, record_statements
from .support import RunClient

pytestmark = pytest.mark.django_db(transaction=True)


def _assert_no_open_transaction() -> None:
    assert not connection.in_atomic_block
    if is_postgres() and connection.connection is not None:
        assert connection.connection.info.transaction_status == 0  # IDLE: nothing left open


def _lifecycle(run: RunClient) -> list[dict]:
    outcomes = [run.create(), run.ok("run_started")]
    _assert_no_open_transaction()
    for n in range(3):
        outcomes.append(run.step(f"s{n}"))
        outcomes.append(run.ok("step_started", f"s{n}"))
        outcomes.append(run.ok("step_completed", f"s{n}", {"result": n}))
        _assert_no_open_transaction()
    outcomes.append(run.hook("h1", "t1"))
    outcomes.append(run.ok("wait_created", "w1", {"resumeAt": 0}))
    outcomes.append(run.ok("run_completed", event_data={"output": "done"}))
    _assert_no_open_transaction()
    return outcomes


def test_a_lifecycle_commits_every_event(run):
    outcomes = _lifecycle(run)
    assert outcomes[1]["run"]["status"] == "running"
    assert [e["eventType"] for e in outcomes[1]["events"]] == ["run_created", "run_started"]
    assert outcomes[-1]["releasedHooks"] == [{"hookId": "h1", "token": "t1"}]
    assert outcomes[-1]["event"]["eventId"] == format_event_id(14)
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 14
    assert run.get_run() == outcomes[-1]["run"]
    assert [s["status"] for s in run.list_steps()["data"]] == ["completed"] * 3
    assert run.list_hooks()["data"] == []
    assert run.event_ids() == [format_event_id(n) for n in range(1, 15)]


@pytest.mark.postgres_only
def test_an_event_takes_two_round_trips(run, monkeypatch):
    import psycopg

    _lifecycle(RunClient(run.rpc, "wrun_warm"))  # statements are prepared once per connection
    sent = record_statements(monkeypatch, psycopg.ClientCursor)
    outcomes = _lifecycle(run)
    monkeypatch.undo()
    ours = [q for q in sent if q != "SELECT 1"]  # not Django's CONN_HEALTH_CHECKS probes
    # an UPDATE writes only the members that changed (cells/run_store.py ``changed``): when two
    # events fall in the same millisecond, ``updatedAt`` is unchanged and the statement has a
    # shape the warm-up did not prepare, which costs one PREPARE on this connection, once
    prepares = [q for q in ours if q.startswith("PREPARE ")]
    ours = [q for q in ours if not q.startswith("PREPARE ")]
    assert len(prepares) <= 3 and all(" UPDATE " in q for q in prepares), prepares
    assert len(ours) == 2 * len(outcomes), "\n".join(q[:90] for q in ours)
    assert all(q.startswith("BEGIN; EXECUTE wc_run_") for q in ours[::2])
    assert all(q.endswith("; COMMIT") for q in ours[1::2])


def test_a_rejected_event_leaves_nothing_open_or_written(run):
    run.create()
    run.step("s1")
    status, body = run.send("step_failed", "s1", {"error": "e", "stack": 5})
    assert (status, body["error"]["name"]) == (400, "ValidationError")
    _assert_no_open_transaction()
    assert run.get_step("s1")["status"] == "pending"
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 2
    assert run.ok("step_started", "s1")["event"]["eventId"] == format_event_id(3)


def test_a_refused_event_commits_the_bootstrap_it_made(run):
    # Q1: the run and the synthetic run_created stay, the counter does not move
    outcome = run.refused("LEGACY_RUN_NOT_SUPPORTED", "run_started",
                          event_data={"deploymentId": "d", "workflowName": "w", "input": None}, specVersion=1)
    assert "(1)" in outcome["message"]
    _assert_no_open_transaction()
    assert run.get_run()["status"] == "pending"
    assert run.event_types() == ["run_created"]
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 0


def test_a_refused_event_on_a_run_that_never_existed_creates_nothing(run):
    run.refused("STEP_NOT_FOUND", "step_started", "s1")
    run.refused("HOOK_NOT_FOUND", "hook_disposed", "h1")
    run.refused("RUN_NOT_FOUND", "wait_created", "w1", {"resumeAt": 0})
    _assert_no_open_transaction()
    assert not RunCellState.objects.exists()
    run.refused("RUN_NOT_FOUND", "run_started")  # may create a run: its cell row is made
    assert RunCellState.objects.filter(name="wrun_test").exists()
    assert run.create()["event"]["eventId"] == format_event_id(1)


def test_a_database_error_while_writing_rolls_everything_back(run):
    run.create()
    run.step("s1")
    cell = RunCellState.objects.get(name="wrun_test")
    # a row in the way of the next event id: the INSERT fails after the step UPDATE ran
    Event.objects.create(run_id=cell.pk, event_id=format_event_id(3), sequence=3, event_type="wait_created",
                         created_at="2026-01-01T00:00:00Z", body="{}")
    status, body = run.send("step_started", "s1")
    assert (status, body["error"]["name"]) == (500, "IntegrityError")
    _assert_no_open_transaction()
    assert run.get_step("s1")["status"] == "pending"
    assert RunCellState.objects.get(pk=cell.pk).event_sequence == 2
    Event.objects.filter(run_id=cell.pk, event_id=format_event_id(3)).delete()
    assert run.ok("step_started", "s1")["step"]["attempt"] == 1


def test_a_crash_between_reading_and_writing_releases_the_lock(run, monkeypatch):
    run.create()
    with faults.inject("store_event", ZeroDivisionError("injected")):
        status, _ = run.send("wait_created", "w1", {"resumeAt": 0})
    assert status == 500
    _assert_no_open_transaction()
    if is_postgres():
        with transaction.atomic():  # nobody holds the cell's row lock any more
            RunCellState.objects.select_for_update(nowait=True).get(name="wrun_test")
    assert run.ok("wait_created", "w1", {"resumeAt": 0})["event"]["eventId"] == format_event_id(2)


@pytest.mark.postgres_only
def test_reads_after_the_lock_see_what_the_previous_holder_committed(run):
    # The lock and the reads are separate statements of one query string: the
    # reads take their snapshot after the lock is granted. (A single
    # "SELECT … JOIN … FOR UPDATE OF cell" would re-check only the cell row
    # after waiting and return the step as it was before the holder's commit.)
    run.create()
    run.ok("run_started")
    run.step("s1")
    run.ok("step_started", "s1")
    locked, release = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                RunCellState.objects.select_for_update().get(name="wrun_test")
                Step.objects.filter(step_id="s1").update(status="completed")
                locked.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def writer():
        try:
            return RunClient(RpcClient(Client()), "wrun_test").apply("step_failed", "s1", {"error": "late"})
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        held = pool.submit(holder)
        assert locked.wait(timeout=10)
        waiting = pool.submit(writer)
        time.sleep(0.3)
        assert not waiting.done()
        release.set()
        held.result(timeout=10)
        outcome = waiting.result(timeout=10)
    assert (outcome["ok"], outcome.get("code")) == (False, "ENTITY_CONFLICT"), outcome
    assert outcome["message"] == 'Cannot modify step in terminal state "completed"'


@pytest.mark.postgres_only
def test_it_recovers_when_prepared_statements_vanish(run):
    run.create()
    run.step("s1")
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does
    assert run.ok("step_started", "s1")["event"]["eventId"] == format_event_id(3)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    assert run.get_step("s1")["attempt"] == 1
    assert run.list_events()["data"][-1]["eventType"] == "step_started"
    _assert_no_open_transaction()


def test_without_batching_each_statement_goes_alone(run, monkeypatch):
    # PostgreSQL with OPTIONS["server_side_binding"] (and SQLite, always)
    monkeypatch.setattr(storage, "batches_statements", lambda db: False)
    outcomes = _lifecycle(run)
    assert outcomes[-1]["event"]["eventId"] == format_event_id(14)
    assert run.event_ids() == [format_event_id(n) for n in range(1, 15)]


def test_reads_the_open_did_not_preload_see_queued_writes(run):
    run.create()
    run.ok("run_started")
    run.hook("h0", "t0")
    with transaction.atomic():
        cell = LockedRunCell("wrun_test")
        cell.open(run="slim")  # nothing else preloaded
        assert cell.load_run(full=False)["status"] == "running"
        assert "input" in cell.load_run(full=True)
        assert cell.load_step("s1") is None
        step = {"runId": "wrun_test", "stepId": "s1", "stepName": "n", "status": "pending", "attempt": 0,
                "createdAt": cell.load_run()["createdAt"], "updatedAt": cell.load_run()["createdAt"]}
        cell.create_step(step)
        cell.store_event({"eventType": "step_created", "correlationId": "s1", "runId": "wrun_test",
                          "eventId": format_event_id(4), "createdAt": step["createdAt"]})
        cell._steps.clear()  # forget the cache: the next read goes to the database
        assert cell.load_step("s1")["stepName"] == "n"
        assert [e["eventId"] for e in cell.first_events(10)] == [format_event_id(n) for n in (1, 2, 3, 4)]
        assert cell.has_marker("h0") and not cell.has_marker("h9")
        assert cell.load_hook("h0")["token"] == "t0"
        assert cell.release_all_hooks() == [("h0", "t0")]
        cell.save_event_sequence(4)
        cell.finish()
    assert run.list_hooks()["data"] == []
    assert run.get_step("s1")["status"] == "pending"
    assert RunCell("wrun_test").apply_event(
        {"runId": "wrun_test", "data": {"eventType": "step_started", "correlationId": "s1"}})["ok"]


def test_only_a_pending_run_preloads_its_events_for_run_started(run):
    # run_started is replayed by every flow invocation: a running run must not
    # read (up to 1000) event bodies it will not return
    run.create()
    with transaction.atomic():
        cell = LockedRunCell("wrun_test")
        event_machine.open_cell(cell, event_machine.EventRequest("wrun_test", {"eventType": "run_started"}))
        assert [e["eventType"] for e in cell.first_events(1000)] == ["run_created"]
        assert cell._first_bodies is not None
    run.ok("run_started")
    with transaction.atomic():
        cell = LockedRunCell("wrun_test")
        event_machine.open_cell(cell, event_machine.EventRequest("wrun_test", {"eventType": "run_started"}))
        assert cell._first_bodies is None
        assert len(cell.first_events(1000)) == 2  # still right if asked
    assert "events" not in run.ok("run_started")
