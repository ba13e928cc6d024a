"""End to end: stuck-run repair and retention through a real fleet (docs/lifecycle.md).

On SQLite the fleet is ``manage.py devfleet``; on PostgreSQL gunicorn + a
Celery worker + beat. Sweeps are real processes: ``manage.py reconcile``
and ``manage.py retention --now`` runs, and fleet restarts (the dev fleet's
ticker and a new worker each sweep at startup). The workflow is the
``OrderRuntime`` stand-in for the Workflow DevKit runtime.
"""
from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import psycopg
import pytest
from django.conf import settings

from tests.e2e.fleet_processes import PY, ROOT, base_env, celery_fleet, dev_fleet
from tests.e2e.order_runtime import OrderRuntime
from tests.services import wait_for
from worldcell_client import RpcCallError, WorldClient

pytestmark = pytest.mark.slow

LIFECYCLE_ENV = {
    "WORLDCELL_STUCK_RUN_AFTER": "2s",
    "WORLDCELL_LIFECYCLE_INTERVAL_S": "3600",  # sweeps only at startup and when the test runs one
    "QUEUE_MAX_ATTEMPTS": "30",
    "WORLDCELL_RETENTION_SETTLE_MS": "0",
}


class FleetDb:
    """A brand-new database for one test's fleet, and plain SQL on it from the test."""

    def __init__(self, tmp_path: Path):
        db = settings.DATABASES["default"]
        self.postgres = db["ENGINE"].endswith("postgresql")
        if self.postgres:
            self.name = f"worldcell_lc_{uuid.uuid4().hex[:8]}"
            host, port, user = db["HOST"] or "127.0.0.1", db["PORT"] or 5432, db["USER"] or "postgres"
            self.admin = f"host={host} port={port} user={user} dbname=postgres"
            self.dsn = f"host={host} port={port} user={user} dbname={self.name}"
            self.url = f"postgres://{user}@{host}:{port}/{self.name}"
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
        else:
            self.path = tmp_path / "fleet.sqlite3"
            self.url = f"sqlite:///{self.path}"

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        if self.postgres:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                cur = conn.execute(statement.replace("?", "%s"), params)
                return cur.fetchall() if cur.description else []
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
            with conn:
                cur = conn.execute(statement, params)
                return cur.fetchall()

    def drop(self) -> None:
        if self.postgres:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@contextlib.contextmanager
def fleet(db: FleetDb, tmp_path: Path, broker_url: str):
    """Start the fleet on ``db`` (Celery over ``broker_url`` on PostgreSQL); yields ``(url, secret)`` (a new secret each start)."""
    env = dict(LIFECYCLE_ENV)
    if db.postgres:
        with celery_fleet(db.url, tmp_path, tmp_path, broker_url=broker_url, extra_env=env) as (url, secret, _):
            yield url, secret
    else:
        with dev_fleet(db.url, tmp_path, tmp_path / "devfleet.log", extra_env=env) as (url, secret, _):
            yield url, secret


def manage(db: FleetDb, tmp_path: Path, *args: str, **env: str) -> str:
    """Run ``manage.py <args>`` on the fleet's database (a process of its own); returns its output."""
    e = base_env(db.url, "unused", tmp_path, **{**LIFECYCLE_ENV, **env})
    proc = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def dump_logs(tmp_path: Path) -> None:
    for log in sorted(tmp_path.glob("*.log")):
        print(f"===== {log.name} =====")
        print(log.read_text(errors="replace")[-6000:])


def take_down(app: OrderRuntime) -> int:
    """Stop the app's HTTP server (connections are refused); returns its port."""
    port = app.server.server_address[1]
    app.server.server_close()
    return port


def bring_up(app: OrderRuntime, port: int) -> None:
    """Serve the app again on the same port."""
    app.server = ThreadingHTTPServer(("127.0.0.1", port), app.server.RequestHandlerClass)
    app.thread = Thread(target=app.server.serve_forever, daemon=True)
    app.thread.start()


@pytest.mark.slow(reason="three fleet starts and stuck-run sweeps that wait out the 2 s stuck threshold")
def test_a_purged_run_is_repaired_exactly_once_across_sweeps_and_restarts_then_completes(tmp_path, broker_url):
    db = FleetDb(tmp_path)
    try:
        with fleet(db, tmp_path, broker_url) as (url, secret):
            app = OrderRuntime(url, secret, shards=1)
            port = take_down(app)  # the app is down: a repair message can only wait and retry
            run_id = app.start_order("order-stuck")
            # the flow message is lost: an operator purged it
            assert db.sql('SELECT COUNT(*) FROM "queueing_message" WHERE "run_id" = ?', (run_id,)) == [(1,)]
            db.sql('DELETE FROM "queueing_message" WHERE "run_id" = ?', (run_id,))
            time.sleep(2.5)
            out = manage(db, tmp_path, "reconcile")  # sweep 1
            assert "repaired 1" in out, out
            assert "repaired 0" in manage(db, tmp_path, "reconcile")  # sweep 2
        with fleet(db, tmp_path, broker_url):  # restart 1 (the dev fleet's ticker sweeps at startup)
            time.sleep(1)
            assert "repaired 0" in manage(db, tmp_path, "reconcile")  # sweep 3
        with fleet(db, tmp_path, broker_url) as (url, secret):  # restart 2
            time.sleep(1)
            assert "repaired 0" in manage(db, tmp_path, "reconcile")  # sweep 4
            assert "repaired 0" in manage(db, tmp_path, "reconcile")  # sweep 5
            repairs = db.sql('SELECT "message_id", "event_sequence" FROM "cells_runrepair" WHERE "run_id" = ?',
                             (run_id,))
            assert len(repairs) == 1, repairs
            live = db.sql('SELECT "message_id", "idempotency_key" FROM "queueing_message" WHERE "run_id" = ?',
                          (run_id,))
            assert live == [(repairs[0][0], f"repair:{run_id}:{repairs[0][1]}")]
            app.world = WorldClient(url, secret)
            bring_up(app, port)  # the real handler answers: the retried repair message drives the run
            try:
                token = f"approve-{run_id}"
                wait_for(lambda: app.world.hook_by_token(token), 120, "the approval hook")
                # parked on its hook: sweeps leave it alone
                time.sleep(2.5)
                assert "0 stuck run(s)" in manage(db, tmp_path, "reconcile")
                app.approve(token, {"approved": True})
                wait_for(lambda: app.world.call("runs", run_id, "getRun")["status"] == "completed", 90,
                         "the run completed")
            except BaseException:
                dump_logs(tmp_path)
                raise
            finally:
                app.server.shutdown()
                app.server.server_close()
            assert app.errors == []
            flows = [d for d in app.deliveries if d["path"].endswith("/flow")]
            assert flows[0]["messageId"] == repairs[0][0]  # the first flow the app ever saw was the repair
            assert len(db.sql('SELECT 1 FROM "cells_runrepair"')) == 1
    finally:
        db.drop()


def test_retention_expires_a_finished_run_and_the_client_sees_it_gone(tmp_path, broker_url):
    db = FleetDb(tmp_path)
    try:
        with fleet(db, tmp_path, broker_url) as (url, secret), OrderRuntime(url, secret, shards=1) as app:
            run_id = app.start_order("order-old")
            token = f"approve-{run_id}"
            wait_for(lambda: app.world.hook_by_token(token), 60, "the approval hook")
            app.approve(token, {"approved": True})
            wait_for(lambda: app.world.call("runs", run_id, "getRun")["status"] == "completed", 60, "completion")
            keep = app.start_order("order-young")
            out = manage(db, tmp_path, "retention", "--now", WORLDCELL_RUN_RETENTION="1ms")
            assert "expired 1, finished 1 cleanup(s)" in out, out
            with pytest.raises(RpcCallError) as err:
                app.world.call("runs", run_id, "getRun")
            assert (err.value.status, err.value.name) == (410, "RunExpiredError")
            assert f'Workflow run "{run_id}" expired at ' in str(err.value)
            outcome = app.world.apply_event(run_id, {"eventType": "run_started"})
            assert (outcome["ok"], outcome["code"]) == (False, "RUN_EXPIRED")
            keys = [k["name"] for k in app.world.call("index", "index", "list", {"prefix": "runall:"})["keys"]]
            assert keys and all(k.endswith(keep) for k in keys)
            assert db.sql('SELECT "status", "phase" FROM "cells_runtombstone" WHERE "run_id" = ?', (run_id,)) == [
                ("completed", "done")]
            for table in ("cells_event", "cells_step", "cells_run"):
                cell = db.sql('SELECT "id" FROM "cells_runcellstate" WHERE "name" = ?', (run_id,))[0][0]
                column = "cell_id" if table == "cells_run" else "run_id"
                assert db.sql(f'SELECT COUNT(*) FROM "{table}" WHERE "{column}" = ?', (cell,)) == [(0,)]
            assert app.errors == []
    finally:
        db.drop()
