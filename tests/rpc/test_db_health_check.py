"""The PostgreSQL backend's health check (worldcell/dbbackend/postgresql/base.py).

A quiet idle connection is kept without a ``SELECT 1`` round trip; a connection the server
closed is still noticed before the request uses it, in-process and through the README's
waitress command (every call after the backends are terminated answers 200, none 500).
"""
from __future__ import annotations

import time
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connection

from tests.conftest import is_postgres, record_statements

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(not is_postgres(), reason="PostgreSQL backend only"),
]


def _admin_dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER'] or 'postgres'} dbname=postgres"


def _probes(monkeypatch) -> list[str]:
    """Record every statement sent on plain psycopg cursors (where Django's probe goes)."""
    return record_statements(monkeypatch, psycopg.Cursor)


def _start_request() -> None:
    """What Django does for a kept connection at a request's start (``close_old_connections``)."""
    connection.health_check_done = False
    connection.close_if_health_check_failed()


@pytest.mark.django_db(transaction=True)
def test_a_quiet_idle_connection_is_kept_without_a_probe(monkeypatch):
    assert connection.vendor == "postgresql" and connection.health_check_enabled
    connection.ensure_connection()
    pg = connection.connection
    sent = _probes(monkeypatch)
    for _ in range(3):
        _start_request()
    assert connection.connection is pg and sent == []


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_closed_is_replaced_before_use():
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True
    deadline = time.monotonic() + 5
    while connection.connection is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # the server's FATAL message and end-of-file arrive asynchronously
        _start_request()
    assert connection.connection is None  # closed before any statement could fail on it
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        assert cur.fetchone()[0] != pid


def test_the_production_server_answers_every_call_after_its_backends_are_killed(production_server):
    srv = production_server
    for i in range(12):  # several of waitress's 8 threads hold a connection now
        assert srv.call("index", "index", "put", f"k{i}", i)[0] == 200
    database = urlsplit(srv.database_url).path.lstrip("/")
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        # pids first, then one by one: never a pg_terminate_backend the planner could apply to other rows
        pids = [r[0] for r in admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database])]
        assert pids
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    time.sleep(0.3)
    answers = [srv.call("index", "index", "put", f"after{i}", i)[0] for i in range(24)]
    assert answers == [200] * 24
    assert [srv.call("index", "index", "get", f"after{i}")[1] for i in range(24)] == list(range(24))

