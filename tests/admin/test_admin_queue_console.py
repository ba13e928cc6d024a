"""The live queue dashboard, the outcome chart, driver liveness and the attempt log (queueing/console.py).

Pages are rendered by the test client; their query counts must not grow with the number of
messages, logged attempts, counter minutes or heartbeats. The real-server checks are in
``test_admin_queue_console_servers.py``.
"""
from __future__ import annotations

import re

import pytest

from queueing import attempt_log, liveness
from queueing.models import DeadLetter, DeliveryAttempt, Message, OutcomeMinute, QueueCell
from worldcell import clock
from worldcell.health import record_beat
from worldcell.models import Heartbeat

pytestmark = pytest.mark.django_db

CELLS = "/admin/queueing/queuecell/"
LIVE = "/admin/queueing/queuecell/live/"


def seed(n: int, now: int, tag: str = "") -> tuple[Message, DeadLetter]:
    """``n`` cells' worth of messages, dead letters, attempts (up to the cap), counter minutes and pump heartbeats."""
    msg = dead = None
    for c in range(n):
        cell, _ = QueueCell.objects.get_or_create(name=f"q:{c}", defaults={"queue_shards": n, "alarm_at": now})
        for i in range(n):
            msg = Message.objects.create(
                cell=cell, message_id=f"m{tag}{c}-{i}", queue_name=f"__wkf_step_{i % 3}", pathname="step",
                body='"{\\"runId\\":\\"wrun_1\\"}"', target_base_url="http://app", enqueued_at=now, due_at=now + i,
                updated_at=now,
            )
            dead = DeadLetter.objects.create(
                cell=cell, dlq_key=f"dlq:{now:013d}:d{tag}{c}-{i}", message_id=f"d{tag}{c}-{i}", queue_name="__wkf_step_0",
                pathname="step", body='"{}"', target_base_url="http://app", attempt=5, enqueued_at=now,
                last_error="HTTP 500", failed_at=now,
            )
            for mid in (msg.message_id, dead.message_id):
                DeliveryAttempt.objects.bulk_create(
                    DeliveryAttempt(cell_id=cell.pk, message_id=mid, attempt=k + 1, started_at=now - 1000 + k,
                                    duration_ms=12, status=500, error="HTTP 500", answer_head='{"e":1}',
                                    result="retry scheduled")
                    for k in range(min(n * 4, attempt_log.KEEP_PER_MESSAGE))
                )
        OutcomeMinute.objects.bulk_create(
            OutcomeMinute(cell_id=cell.pk, queue_name=f"__wkf_step_{tag}{q}", minute=now // 60_000 - m, delivered=m + 1,
                          retried=q, dead_lettered=1 if m == 3 else 0)
            for q in range(3) for m in range(min(n * 10, 60))
        )
        record_beat(f"pump:host{c}:{c}", now - 1000)
    record_beat("beat", now - 500)
    return msg, dead


def test_the_dashboard_shows_outcomes_chart_drivers_and_polls_its_fragment(admin_client):
    now = clock.now_ms()
    seed(2, now)
    record_beat("pump:gone:1", now - 60_000)
    page = admin_client.get(CELLS).content.decode()
    assert 'hx-get="/admin/queueing/queuecell/live/"' in page and 'id="wc-live-on" checked' in page
    assert re.search(r'<script src="/static/worldcell/vendor/htmx-2\.0\.4(\.[0-9a-f]+)?\.min\.js" defer>', page)
    assert re.search(r'<link rel="icon" href="/static/worldcell/favicon(\.[0-9a-f]+)?\.svg"', page)
    live = admin_client.get(LIVE).content.decode()
    # two cells × three queue names × 20 minutes: delivered 1..20 each, retried q each minute
    assert f"{2 * 3 * sum(range(1, 21)):,} delivered" in live
    assert f"{2 * 20 * (0 + 1 + 2):,} retried" in live and "6 dead-lettered" in live
    assert live.count("<title>") == 60 and "UTC:" in live
    assert live.count("wc-badge-completed") == 3 and live.count("wc-badge-failed") == 1  # beat, 2 pumps; 1 silent
    assert "beat (through a worker)" in live and "gone:1" in live


def test_the_attempt_log_is_shown_escaped_on_the_message_and_dead_letter_pages(admin_client):
    now = clock.now_ms()
    msg, dead = seed(1, now)
    DeliveryAttempt.objects.create(cell_id=msg.cell_id, message_id=msg.message_id, attempt=9, started_at=now,
                                   duration_ms=3_400, status=None, error="transport error: ReadTimeout: <x>",
                                   answer_head="<script>alert(1)</script>", result="retry scheduled")
    html = admin_client.get(f"/admin/queueing/message/{msg.pk}/change/").content.decode()
    table = html[html.index('class="wc-attempts"'):]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in table and "<script>alert" not in table
    assert "transport error: ReadTimeout: &lt;x&gt;" in table and "3.4 s" in table
    assert table.index(">9<") < table.index(">3<")  # newest first
    html = admin_client.get(f"/admin/queueing/deadletter/{dead.pk}/change/").content.decode()
    assert html.count("HTTP 500") >= 3 and "retry scheduled" in html


def test_a_message_without_logged_attempts_says_so(admin_client):
    cell = QueueCell.objects.create(name="q:0", queue_shards=1)
    m = Message.objects.create(cell=cell, message_id="fresh", queue_name="__wkf_step_x", pathname="step",
                               body='"{}"', target_base_url="http://app", enqueued_at=1, due_at=1, updated_at=1)
    assert "No failed attempt logged" in admin_client.get(f"/admin/queueing/message/{m.pk}/change/").content.decode()


def _queries(admin_client, django_assert_max_num_queries, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get(url).status_code == 200, url
    return len(ctx.captured_queries)


def test_the_console_pages_cost_the_same_queries_whatever_the_data(admin_client, django_assert_max_num_queries):
    now = clock.now_ms()
    admin_client.get(CELLS)  # session warm-up
    small_msg, small_dead = seed(1, now)
    small = {
        "dashboard": _queries(admin_client, django_assert_max_num_queries, CELLS),
        "live": _queries(admin_client, django_assert_max_num_queries, LIVE),
        "message": _queries(admin_client, django_assert_max_num_queries, f"/admin/queueing/message/{small_msg.pk}/change/"),
        "dead": _queries(admin_client, django_assert_max_num_queries, f"/admin/queueing/deadletter/{small_dead.pk}/change/"),
        "messages": _queries(admin_client, django_assert_max_num_queries, "/admin/queueing/message/"),
    }
    big_msg, big_dead = seed(6, now, "b")  # 36× the messages, attempts at the cap, 60 minutes, 6 pumps
    assert DeliveryAttempt.objects.filter(message_id=big_msg.message_id).count() == attempt_log.KEEP_PER_MESSAGE
    big = {
        "dashboard": _queries(admin_client, django_assert_max_num_queries, CELLS),
        "live": _queries(admin_client, django_assert_max_num_queries, LIVE),
        "message": _queries(admin_client, django_assert_max_num_queries, f"/admin/queueing/message/{big_msg.pk}/change/"),
        "dead": _queries(admin_client, django_assert_max_num_queries, f"/admin/queueing/deadletter/{big_dead.pk}/change/"),
        "messages": _queries(admin_client, django_assert_max_num_queries, "/admin/queueing/message/"),
    }
    assert big == small, (small, big)
    assert small["live"] <= 9  # session + user + the fragment's seven


def test_pump_heartbeats_are_rate_limited_listed_and_pruned(monkeypatch):
    liveness._last_touch.update(pid=0, at=0.0)
    liveness.touch_pump()
    first = Heartbeat.objects.get(name=liveness.pump_name()).at_ms
    liveness.touch_pump()  # within PUMP_EVERY_MS: no write
    Heartbeat.objects.filter(name=liveness.pump_name()).update(at_ms=first - 1)
    liveness.touch_pump()
    assert Heartbeat.objects.get(name=liveness.pump_name()).at_ms == first - 1
    now = clock.now_ms()
    record_beat("pump:old:1", now - liveness.FORGET_AFTER_MS - 1)
    names = [d["name"] for d in liveness.drivers(now)]
    assert names[-1] == liveness.pump_name() or liveness.pump_name() in names
    assert liveness.prune(now) == 1 and not Heartbeat.objects.filter(name="pump:old:1").exists()


@pytest.mark.django_db(transaction=True)
def test_a_running_pump_records_its_heartbeat(no_broker):
    from queueing.pump import LocalPump

    liveness._last_touch.update(pid=0, at=0.0)
    Heartbeat.objects.filter(name=liveness.pump_name()).delete()
    pump = LocalPump(interval_s=0.05, max_workers=1, register=False).start()
    try:
        from tests.queueing.support import wait_until

        wait_until(lambda: Heartbeat.objects.filter(name=liveness.pump_name()).exists(), 10, "the pump's heartbeat")
    finally:
        pump.stop(5)
