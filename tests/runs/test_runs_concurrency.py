"""One writer per run, none across runs; all-or-nothing on a crash (docs/architecture.md rules 1–2, docs/protocol.md §1.3).

The race tests need real row locks and real parallel connections: PostgreSQL only.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction
from django.test import Client

from cells import faults
from cells.event_machine import format_event_id
from cells.models import Event, RunCellState, Step

from tests.conftest import RpcClient
from .support import RunClient

THREADS = 16


def _in_threads(count: int, work) -> list:
    """Run ``work(i, client)`` in ``count`` threads released together; returns the results by i."""
    barrier = threading.Barrier(count)

    def one(i: int):
        try:
            barrier.wait(timeout=30)
            return work(i, RpcClient(Client()))
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def _assert_gap_free(run: RunClient) -> list[dict]:
    events = run.list_events({"limit": 10_000})["data"]
    assert [e["eventId"] for e in events] == [format_event_id(n) for n in range(1, len(events) + 1)]
    assert RunCellState.objects.get(name=run.run_id).event_sequence == len(events)
    return events


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
class TestOneRunManyWriters:
    def test_it_creates_a_run_once_when_16_run_created_race(self, rpc):
        def create(i, client):
            return RunClient(client, "wrun_race").apply(
                "run_created", event_data={"deploymentId": "d", "workflowName": "wf", "input": [i]})

        outcomes = _in_threads(THREADS, create)
        assert all(o["ok"] for o in outcomes)
        creators = [o for o in outcomes if "event" in o]
        assert len(creators) == 1
        assert {o["run"]["input"][0] for o in outcomes} == {creators[0]["run"]["input"][0]}
        assert [e["eventType"] for e in _assert_gap_free(RunClient(rpc, "wrun_race"))] == ["run_created"]

    def test_it_creates_a_step_once_when_16_step_created_race(self, rpc):
        run = RunClient(rpc, "wrun_race")
        run.create()
        outcomes = _in_threads(THREADS, lambda i, c: RunClient(c, "wrun_race").apply(
            "step_created", "s1", {"stepName": f"n{i}"}))
        assert sum(o["ok"] for o in outcomes) == 1
        assert {o.get("message") for o in outcomes if not o["ok"]} == {'Step "s1" already exists'}
        assert Step.objects.count() == 1
        assert [e["eventType"] for e in _assert_gap_free(run)] == ["run_created", "step_created"]

    def test_exactly_one_of_racing_run_completed_and_run_failed_wins(self, rpc):
        run = RunClient(rpc, "wrun_race")
        run.create()
        run.ok("run_started")

        def finish(i, client):
            racer = RunClient(client, "wrun_race")
            if i % 2:
                return racer.apply("run_failed", event_data={"error": f"e{i}"})
            return racer.apply("run_completed", event_data={"output": i})

        outcomes = _in_threads(THREADS, finish)
        winners = [o for o in outcomes if o["ok"]]
        assert len(winners) == 1
        status = winners[0]["run"]["status"]
        assert {(o["code"], o["message"]) for o in outcomes if not o["ok"]} == {
            ("ENTITY_CONFLICT", f'Cannot transition run from terminal state "{status}"')}
        assert run.get_run() == winners[0]["run"]
        assert len(_assert_gap_free(run)) == 3

    def test_no_step_started_follows_the_steps_completion(self, rpc):
        run = RunClient(rpc, "wrun_race")
        run.create()
        run.ok("run_started")
        run.step("s1")

        def race(i, client):
            racer = RunClient(client, "wrun_race")
            if i % 4 == 0:
                return racer.apply("step_completed", "s1", {"result": i})
            return racer.apply("step_started", "s1")

        outcomes = _in_threads(THREADS, race)
        completions = [o for o in outcomes if o["ok"] and o["event"]["eventType"] == "step_completed"]
        starts = [o for o in outcomes if o["ok"] and o["event"]["eventType"] == "step_started"]
        assert len(completions) == 1
        assert {o["message"] for o in outcomes if not o["ok"]} == {'Cannot modify step in terminal state "completed"'}
        events = _assert_gap_free(run)
        types = [e["eventType"] for e in events if e.get("correlationId") == "s1"]
        assert types[0] == "step_created" and types[-1] == "step_completed"
        assert types.count("step_started") == len(starts)
        assert run.get_step("s1")["attempt"] == len(starts)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
class TestManyRuns:
    def test_16_runs_proceed_in_parallel(self, rpc):
        def lifecycle(i, client):
            racer = RunClient(client, f"wrun_{i:02d}")
            racer.create()
            racer.ok("run_started")
            for s in range(5):
                racer.step(f"s{s}")
                racer.ok("step_started", f"s{s}")
                racer.ok("step_completed", f"s{s}", {"result": s})
            return racer.ok("run_completed", event_data={"output": i})["event"]["eventId"]

        assert _in_threads(THREADS, lifecycle) == [format_event_id(18)] * THREADS
        for i in range(THREADS):
            assert len(_assert_gap_free(RunClient(rpc, f"wrun_{i:02d}"))) == 18

    def test_a_locked_run_does_not_hold_up_another_run(self, rpc):
        blocked, other = RunClient(rpc, "wrun_blocked"), RunClient(rpc, "wrun_other")
        blocked.create()
        other.create()
        locked, release = threading.Event(), threading.Event()

        def hold_lock():
            try:
                with transaction.atomic():
                    RunCellState.objects.select_for_update().get(name="wrun_blocked")
                    locked.set()
                    release.wait(timeout=30)
            finally:
                connection.close()

        def send_to_blocked():
            try:
                return RunClient(RpcClient(Client()), "wrun_blocked").apply("run_started")
            finally:
                connection.close()

        with ThreadPoolExecutor(max_workers=2) as pool:
            holder = pool.submit(hold_lock)
            assert locked.wait(timeout=10)
            waiting = pool.submit(send_to_blocked)
            started = time.monotonic()
            assert other.ok("run_started")["run"]["status"] == "running"  # not blocked
            assert time.monotonic() - started < 5
            time.sleep(0.3)
            assert not waiting.done()  # the locked run's writer queues behind the lock
            release.set()
            holder.result(timeout=10)
            assert waiting.result(timeout=10)["ok"] is True
        assert blocked.get_run()["status"] == "running"


@pytest.mark.django_db(transaction=True)
class TestCrashes:
    @pytest.mark.parametrize("crash_at", ["store_event", "save_event_sequence"])
    def test_a_crash_after_the_entity_write_leaves_nothing_behind(self, rpc, crash_at):
        run = RunClient(rpc, "wrun_crash")
        run.create()
        run.step("s1")
        before_step, before_events = run.get_step("s1"), run.event_ids()

        with faults.inject(crash_at, RuntimeError("injected crash")):
            status, body = run.send("step_started", "s1")
        assert (status, body["error"]["message"]) == (500, "injected crash")
        assert run.get_step("s1") == before_step
        assert run.event_ids() == before_events
        assert RunCellState.objects.get(name="wrun_crash").event_sequence == 2
        assert run.ok("step_started", "s1")["event"]["eventId"] == format_event_id(3)

    def test_a_crash_while_creating_a_run_leaves_no_cell_behind(self, rpc):
        run = RunClient(rpc, "wrun_crash")
        with faults.inject("store_event", ZeroDivisionError("injected")):
            status, body = run.send("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": 1})
            assert (status, body["error"]["name"]) == (500, "ZeroDivisionError")
            assert not RunCellState.objects.filter(name="wrun_crash").exists()
            assert Event.objects.count() == 0
        assert run.create()["event"]["eventId"] == format_event_id(1)

    def test_a_crash_while_releasing_hooks_keeps_the_run_running(self, rpc):
        run = RunClient(rpc, "wrun_crash")
        run.create()
        run.ok("run_started")
        run.hook("h1", "t1")
        with faults.inject("release_all_hooks", ZeroDivisionError("injected")):
            status, _ = run.send("run_completed", event_data={"output": 1})
        assert status == 500
        assert run.get_run()["status"] == "running"
        assert len(run.list_hooks()["data"]) == 1
        assert run.event_types() == ["run_created", "run_started", "hook_created"]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
class TestConcurrentClientTraffic:
    def test_concurrent_step_creations_and_a_start_all_succeed(self, rpc):
        run = RunClient(rpc, "wrun_busy")
        run.create()

        def work(i, client):
            racer = RunClient(client, "wrun_busy")
            return racer.apply("run_started") if i == 2 else racer.apply("step_created", f"s{i}", {"stepName": "n"})

        assert all(o["ok"] for o in _in_threads(3, work))
        assert len(run.list_steps()["data"]) == 2
        assert len(_assert_gap_free(run)) == 4

    def test_100_concurrent_reads_and_50_concurrent_step_creations(self, rpc):
        run = RunClient(rpc, "wrun_busy")
        run.create()
        reads = _in_threads(THREADS, lambda i, c: [RunClient(c, "wrun_busy").get_run()["runId"] for _ in range(7)])
        assert sum(len(r) for r in reads) >= 100 and {x for r in reads for x in r} == {"wrun_busy"}

        def create_steps(i, client):
            racer = RunClient(client, "wrun_busy")
            return [racer.apply("step_created", f"s{i}-{n}", {"stepName": "n"})["ok"] for n in range(4)]

        assert all(ok for oks in _in_threads(THREADS, create_steps) for ok in oks)
        assert len(_assert_gap_free(run)) == 1 + THREADS * 4
