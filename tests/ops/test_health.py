"""``/healthz/live`` and ``/healthz/ready`` through the Django test client (docs/operations.md "Health").

The checks run in their own threads with their own connections, so these
tests commit their rows (``transaction=True``).
"""
from __future__ import annotations

import json
import time

import pytest

from queueing.models import QueueCell
from queueing.pump import LocalPump
from worldcell import clock, health
from worldcell.models import Heartbeat
from worldcell.rpc import HEALTH_BODY

pytestmark = pytest.mark.django_db(transaction=True)



@pytest.fixture(autouse=True)
def uncached(settings):
    """Each probe here must see the state just set up: no reuse of the previous result."""
    settings.HEALTH_CACHE_S = 0


@pytest.fixture
def celery_mode(settings, broker_url):
    settings.WORLDCELL_USE_CELERY = True
    settings.CELERY_BROKER_URL = broker_url
    return settings


def _ready(client):
    resp = client.get("/healthz/ready")
    return resp.status_code, json.loads(resp.content)


def test_live_is_cheap_and_v1_health_is_unchanged(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        resp = client.get("/healthz/live")
    assert resp.status_code == 200 and json.loads(resp.content) == {"ok": True}
    assert client.get("/v1/health").content == HEALTH_BODY


def test_ready_with_celery_needs_a_recent_beat_tick(client, celery_mode):
    status, body = _ready(client)
    assert status == 503
    assert body["checks"]["beat"]["ok"] is False and "never ticked" in body["checks"]["beat"]["error"]
    for name in ("database", "migrations", "alarms", "broker"):
        assert body["checks"][name]["ok"] is True, body
        assert isinstance(body["checks"][name]["ms"], float)
    health.record_beat()
    status, body = _ready(client)
    assert status == 200 and body["ok"] is True, body
    Heartbeat.objects.filter(name="beat").update(at_ms=clock.now_ms() - 60_000)
    status, body = _ready(client)
    assert status == 503 and "60 s ago" in body["checks"]["beat"]["error"]


def test_fire_due_alarms_records_the_beat_tick(celery_mode):
    from queueing import tasks

    tasks.fire_due_alarms()
    try:
        at = Heartbeat.objects.get(name="beat").at_ms
        assert abs(at - clock.now_ms()) < 5_000
    finally:
        pump = tasks._pump
        if pump is not None:
            pump.stop(5)
            tasks._pump = None


def test_an_overdue_alarm_fails_readiness(client, celery_mode):
    health.record_beat()
    QueueCell.objects.create(name="q:0", queue_shards=1, pinned_at=0, alarm_at=clock.now_ms() - 120_000)
    status, body = _ready(client)
    assert status == 503
    assert body["checks"]["alarms"]["ok"] is False and "120 s overdue" in body["checks"]["alarms"]["error"]
    QueueCell.objects.filter(name="q:0").update(alarm_at=clock.now_ms() - 5_000)
    assert _ready(client)[0] == 200


def test_broker_failure_is_reported_without_its_password(client, celery_mode):
    celery_mode.CELERY_BROKER_URL = "redis://:hunter2@127.0.0.1:1/0"
    health.record_beat()
    status, body = _ready(client)
    assert status == 503 and body["checks"]["broker"]["ok"] is False
    assert "hunter2" not in json.dumps(body)
    assert body["checks"]["broker"]["ms"] <= celery_mode.HEALTH_CHECK_TIMEOUT_S * 1000 + 500


def test_without_celery_the_pump_must_be_running(client, settings):
    settings.WORLDCELL_USE_CELERY = False
    status, body = _ready(client)
    assert status == 503 and "no queue pump" in body["checks"]["pump"]["error"]
    assert "broker" not in body["checks"] and "beat" not in body["checks"]
    pump = LocalPump(interval_s=0.05).start()
    time.sleep(0.3)  # its first ticks
    try:
        status, body = _ready(client)
        assert status == 200, body
    finally:
        pump.stop(5)
    status, body = _ready(client)
    assert status == 503


def test_unapplied_migrations_fail_readiness(client, settings):
    from django.db.migrations.recorder import MigrationRecorder

    settings.WORLDCELL_USE_CELERY = False
    recorder = MigrationRecorder.Migration.objects
    latest = recorder.filter(app="worldcell").order_by("-id").first().name  # the app's newest migration
    recorder.filter(app="worldcell", name=latest).delete()
    try:
        status, body = _ready(client)
        assert status == 503
        assert f"worldcell.{latest}" in body["checks"]["migrations"]["error"]
    finally:
        recorder.create(app="worldcell", name=latest)


@pytest.mark.parametrize("path", ["/healthz/live", "/healthz/ready", "/metrics"])
@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_other_methods_than_get_answer_405_json_not_the_csrf_page(path, method):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)  # as a real server: no test-client CSRF bypass
    resp = getattr(client, method)(path)
    assert resp.status_code == 405, resp.content[:300]
    assert resp["Content-Type"] == "application/json" and resp["Allow"] == "GET, HEAD"
    assert json.loads(resp.content)["error"]["name"] == "MethodNotAllowed"
    assert client.head(path).status_code in (200, 503)
