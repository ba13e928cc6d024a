"""Readiness follows PostgreSQL and Redis going away and coming back (issue 12 part 3).

A private PostgreSQL cluster and a private redis-server (started here, never
the shared ones) back a gunicorn + Celery worker + beat fleet started as
README.md says. ``/healthz/ready`` must answer 503 within 5 s of stopping
either and 200 within 5 s of its return; ``/healthz/live`` stays 200.
"""
from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.fleet_processes import celery_fleet
from tests.services import free_port, private_postgres, private_redis

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

PG_PORT, REDIS_PORT = free_port(), free_port()  # chosen once per test session


def _ready(url: str) -> tuple[int, dict]:
    try:
        resp = httpx.get(f"{url}/healthz/ready", timeout=4)
        return resp.status_code, resp.json()
    except httpx.HTTPError as exc:
        return 0, {"transport": str(exc)}


def _until(url: str, status: int, within_s: float) -> tuple[float, dict]:
    started = time.monotonic()
    last: tuple[int, dict] = (0, {})
    while time.monotonic() - started < within_s:
        last = _ready(url)
        if last[0] == status:
            return time.monotonic() - started, last[1]
        time.sleep(0.1)
    raise AssertionError(f"/healthz/ready did not answer {status} within {within_s} s; last: {last}")


def test_readiness_follows_postgres_and_redis(tmp_path):
    with private_postgres(PG_PORT) as pg, private_redis(REDIS_PORT) as redis:
        with celery_fleet(pg.url, tmp_path, tmp_path, redis.url,
                          extra_env={"DATABASE_CONN_MAX_AGE": "600"}) as (url, _, _):
            took, body = _until(url, 200, 30)  # beat's first tick reaches the database
            assert set(body["checks"]) == {"database", "migrations", "alarms", "broker", "beat"}

            pg.stop()
            took, body = _until(url, 503, 5)
            print(f"postgres stopped: 503 after {took:.2f} s")
            assert body["checks"]["database"]["ok"] is False, body
            assert httpx.get(f"{url}/healthz/live", timeout=2).status_code == 200
            pg.start()
            took, body = _until(url, 200, 5)
            print(f"postgres back: 200 after {took:.2f} s")
            assert all(c["ok"] for c in body["checks"].values())

            redis.stop()
            took, body = _until(url, 503, 5)
            print(f"redis stopped: 503 after {took:.2f} s")
            assert body["checks"]["broker"]["ok"] is False and body["checks"]["database"]["ok"] is True, body
            redis.start()
            took, body = _until(url, 200, 5)
            print(f"redis back: 200 after {took:.2f} s")
