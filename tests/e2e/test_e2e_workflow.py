"""End to end: a Python stand-in for the Workflow DevKit runtime drives whole runs
through a real fleet over HTTP (issue #6).

On SQLite the fleet is ``manage.py devfleet`` (waitress + in-process pump); on
PostgreSQL it is the README's API server (waitress) + a Celery worker (threads pool) + Celery beat over
Redis. Each test gets a brand-new database that the fleet migrates itself.
"""
from __future__ import annotations

import contextlib

import pytest

from tests.e2e.fleet_processes import celery_fleet, dev_fleet
from tests.services import fresh_database, suite_is_postgres, wait_for
from tests.e2e.order_runtime import OrderRuntime

pytestmark = pytest.mark.slow

SHARDS = 2


@contextlib.contextmanager
def fresh_fleet(tmp_path, broker_url: str):
    with fresh_database(tmp_path) as url:
        if suite_is_postgres():
            with celery_fleet(url, tmp_path, tmp_path, broker_url=broker_url) as (fleet_url, secret, _):
                yield fleet_url, secret
        else:
            with dev_fleet(url, tmp_path, tmp_path / "devfleet.log") as (fleet_url, secret, _):
                yield fleet_url, secret


def dump_logs(tmp_path):
    for log in sorted(tmp_path.glob("*.log")):
        print(f"===== {log.name} =====")
        print(log.read_text(errors="replace")[-6000:])


def test_it_runs_order_workflows_to_completion(tmp_path, broker_url):
    with fresh_fleet(tmp_path, broker_url) as (fleet_url, secret), OrderRuntime(fleet_url, secret, shards=SHARDS) as app:
        try:
            world = app.world
            assert world.health()["name"] == "world-celld"
            run_ids = [app.start_order(f"order-{i}") for i in range(3)]
            for run_id in run_ids:
                token = f"approve-{run_id}"
                wait_for(lambda: world.hook_by_token(token), 30, f"hook of {run_id}")
                app.approve(token, {"approved": True})
            for run_id in run_ids:
                wait_for(lambda: world.call("runs", run_id, "getRun")["status"] == "completed", 60, f"{run_id} completed")
            wait_for(lambda: all(
                (lambda s: s["pending"] == 0 and s["inflight"] == 0)(world.call("queue", f"q:{i}", "stats"))
                for i in range(SHARDS)), 20, "an empty queue")
        except BaseException:
            dump_logs(tmp_path)
            raise

        assert app.errors == []
        for run_id in run_ids:
            run = world.call("runs", run_id, "getRun")
            assert run["status"] == "completed"
            assert run["output"] == f"ship_{run_id[-6:]}".encode()
            assert run["input"] == run["executionContext"]["orderId"].encode()
            steps = world.call("runs", run_id, "listSteps", {"limit": 10})["data"]
            assert [(s["stepId"], s["status"], s["attempt"]) for s in steps] == [
                ("step_validate", "completed", 1), ("step_ship", "completed", 2)]
            types = [e["eventType"] for e in app.events(run_id)]
            assert types[:2] == ["run_created", "run_started"]
            assert types.count("run_started") == 1  # replays of run_started append nothing
            for expected in ("hook_created", "hook_received", "wait_created", "wait_completed", "run_completed"):
                assert types.count(expected) == 1, (expected, types)
            assert types.count("step_started") == 3 and types[-1] == "run_completed"
            # terminal run released the hook: no live hook, no index entries
            assert world.call("runs", run_id, "listHooks")["data"] == []
            assert world.hook_by_token(f"approve-{run_id}") is None
            assert world.call("index", "index", "get", "hookid:hook_approval") is None
            # the stream is complete and closed, and registered for the run
            chunks, done = world.read_stream(app.stream_name(run_id))
            text = b"".join(chunks).decode()
            assert done is True
            assert text == (f"validating\nawaiting approval: POST /approvals/approve-{run_id}\n"
                            f"approved, shipping in 1s\nshipped as ship_{run_id[-6:]}\n")
            assert world.call("streams", f"run-streams:{run_id}", "listStreams") == [app.stream_name(run_id)]
            # the run is listed through the index, with its final status
            keys = world.call("index", "index", "list", {"prefix": "run:order:"})["keys"]
            assert any(k["name"].endswith(run_id) for k in keys)
        # the ship step was retried once by the queue (HTTP 500 on attempt 1)
        ship_attempts = sorted(d["attempt"] for d in app.deliveries if d["body"].get("stepId") == "step_ship")
        assert ship_attempts == sorted([1, 2] * len(run_ids))
        for i in range(SHARDS):
            stats = world.call("queue", f"q:{i}", "stats")
            assert (stats["pending"], stats["inflight"], stats["deadLetters"]) == (0, 0, 0), stats
