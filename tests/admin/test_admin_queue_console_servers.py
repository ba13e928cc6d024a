"""The queue console through real servers (docs/queue-console.md): waitress as README.md starts it with
a real Celery worker and beat on PostgreSQL, devfleet on SQLite; deliveries to a real HTTP target.

* (one fleet per database: the kill first, then the pages with the second worker alive)
* the dashboard and its live fragment show the outcome counts, the chart and live drivers (beat,
  the worker's or devfleet's pump); htmx is served byte for byte as vendored, the favicon exists;
* the dead-letter page shows every failed attempt with its status and the answer's first bytes
  (escaped);
* a worker killed (SIGKILL) in the middle of a POST leaves no attempt row and no count behind; the
  next worker redelivers and the counters show exactly the outcomes that were applied.
"""
from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.e2e.fleet_processes import ROOT, base_env, celery_fleet, dev_fleet
from tests.ops.support import admin_login, cookie_header, create_superuser, fresh_database, suite_is_postgres
from tests.queueing.support import Answer, HttpSink, wait_until
from tests.services import CeleryProc
from worldcell_client import WorldClient

pytestmark = pytest.mark.slow

HTMX = ROOT / "worldcell" / "static" / "worldcell" / "vendor" / "htmx-2.0.4.min.js"


def _get(url: str, path: str, jar: dict[str, str]) -> httpx.Response:
    resp = httpx.get(f"{url}{path}", headers=cookie_header(jar), timeout=20)
    assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
    return resp


def _deliver_and_check_pages(
    url: str, secret: str, sink: HttpSink, drivers: tuple[str, ...], delivered_before: int = 0
) -> None:
    script = {"m_dead": Answer(500, b"<b>down</b> " + b"y" * 1000), "m_ok": Answer(200)}
    sink.script(lambda rec: script[rec.message_id])
    client = WorldClient(url, secret)
    for mid in ("m_ok", "m_dead"):
        client.enqueue("__wkf_step_console", {"n": 1}, target_base_url=sink.url, message_id=mid)
    wait_until(lambda: client.list_dead_letters(0)["data"], 30, "the dead letter")

    resp, jar = admin_login(url)
    assert resp.status_code == 302
    # the live fragment: counts of the outcomes, and the drivers alive
    def fragment() -> str:
        return _get(url, "/admin/queueing/queuecell/live/", jar).text

    wait_until(lambda: fragment().count("wc-badge-completed") >= len(drivers), 20, "live drivers")
    live = fragment()
    assert live.startswith("<div id=\"wc-live\"") or 'id="wc-live"' in live
    for legend in (f"{delivered_before + 1} delivered", "1 retried", "1 dead-lettered", "0 dropped"):
        assert legend in live, legend
    for name in drivers:
        assert name in live, name
    assert "<svg" in live and " UTC" in live

    page = _get(url, "/admin/queueing/queuecell/", jar).text
    assert 'id="wc-live"' in page and 'id="wc-live-on"' in page and 'hx-trigger="every 5s' in page
    [htmx] = re.findall(r'<script src="([^"]*htmx-2\.0\.4[^"]*)"', page)
    assert httpx.get(f"{url}{htmx}", timeout=20).content == HTMX.read_bytes()
    [icon] = re.findall(r'<link rel="icon" href="([^"]+)"', page)
    fav = httpx.get(f"{url}{icon}", timeout=20)
    assert fav.status_code == 200 and fav.headers["content-type"].startswith("image/svg+xml")

    listing = _get(url, "/admin/queueing/deadletter/", jar).text
    [dead_url] = re.findall(r'href="(/admin/queueing/deadletter/\d+/change/[^"]*)"', listing)
    dead = _get(url, dead_url.replace("&amp;", "&"), jar).text
    table = dead[dead.index('class="wc-attempts"'):]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3  # header + 2 attempts
    assert table.count("HTTP 500") == 2 and "dead-lettered" in table and "retry scheduled" in table
    assert "&lt;b&gt;down&lt;/b&gt;" in table and "<b>down" not in table
    assert "y" * 500 in table and "y" * 520 not in table  # the first 512 bytes only


def test_the_console_through_devfleet(tmp_path):
    if suite_is_postgres():
        pytest.skip("PostgreSQL runs the console through waitress + Celery (the test below); devfleet on SQLite")
    sink = HttpSink()
    try:
        with fresh_database(tmp_path) as db_url:
            create_superuser(db_url, tmp_path)
            with dev_fleet(db_url, tmp_path, tmp_path / "devfleet.log", {"QUEUE_MAX_ATTEMPTS": "2"}) as (
                url, secret, _
            ):
                _deliver_and_check_pages(url, secret, sink, (":",))
    finally:
        sink.close()


@pytest.mark.postgres_only
def test_the_console_through_waitress_and_celery_and_a_worker_killed_mid_post(tmp_path, broker_url):
    sink = HttpSink()
    first = second = None
    try:
        with fresh_database(tmp_path) as db_url:
            create_superuser(db_url, tmp_path)
            extra = {"QUEUE_CLAIM_LEASE_MS": "1500", "QUEUE_MAX_ATTEMPTS": "2"}
            with celery_fleet(db_url, tmp_path, tmp_path, broker_url, extra_env=extra, processes=("api", "beat")) as (
                url, secret, _
            ):
                env = base_env(db_url, secret, tmp_path, CELERY_BROKER_URL=broker_url, WORLDCELL_USE_CELERY="true",
                               **extra)
                sink.hold()
                first = CeleryProc("worker", "worker1", tmp_path, env)
                WorldClient(url, secret).enqueue("__wkf_step_kill", {"n": 1}, target_base_url=sink.url,
                                                 message_id="m_kill")
                assert sink.wait_for(1, 30)
                first.kill9()  # in the middle of the POST
                second = CeleryProc("worker", "worker2", tmp_path, env)
                time.sleep(2.0)  # the killed claim's lease lapses; the new worker's pump claims it again
                sink.release()
                assert sink.wait_for(2, 30)
                resp, jar = admin_login(url)
                wait_until(lambda: "1 delivered" in _get(url, "/admin/queueing/queuecell/live/", jar).text, 30,
                           "the redelivery's ack")
                live = _get(url, "/admin/queueing/queuecell/live/", jar).text
                assert "0 retried" in live and "0 dead-lettered" in live  # the killed POST applied nothing
                listing = _get(url, "/admin/queueing/message/", jar).text
                assert "0 messages" in listing
                # the same fleet with the second worker alive: the pages as an operator sees them
                _deliver_and_check_pages(url, secret, sink, ("beat (through a worker)", ":"), delivered_before=1)
    finally:
        sink.close()
        for proc in (first, second):
            if proc is not None:
                proc.stop()
