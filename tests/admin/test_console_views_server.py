"""Console v2 through the real waitress server as README.md starts it (issue 15).

A fresh database, a superuser, a 53-step run with retries, sleeps, a hook and
a stream played over the RPC route by ``worldcell_client``; then, logged in
like a browser: the run page with its waterfall, the htmx fragment URLs the
pages poll, the stream viewer, the whole-stream download, and the vendored
htmx file byte for byte.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.fleet_processes import api_server
from tests.ops.support import admin_login, cookie_header, create_superuser, fresh_database
from worldcell_client import WorldClient

from .console_story import play_run

pytestmark = pytest.mark.slow

HTMX = Path(__file__).resolve().parents[2] / "worldcell/static/worldcell/vendor/htmx-2.0.4.min.js"
#: sha256 of dist/htmx.min.js in the npm package htmx.org@2.0.4.
HTMX_SHA256 = "e209dda5c8235479f3166defc7750e1dbcd5a5c1808b7792fc2e6733768fb447"


class HttpSequence:
    """``play_run``'s ``seq`` over HTTP: events through ``WorldClient.apply_event`` (the JS client's sequence)."""

    def __init__(self, world: WorldClient):
        self.world = world

    def apply(self, run_id, event_type, correlation_id=None, **event_data):
        data = {"eventType": event_type}
        if correlation_id is not None:
            data["correlationId"] = correlation_id
        if event_data or event_type not in ("run_started", "run_cancelled", "hook_disposed", "step_started"):
            data["eventData"] = event_data
        outcome = self.world.apply_event(run_id, data)
        assert outcome["ok"], outcome
        return outcome

    def create_run(self, run_id, workflow, deployment, input):
        return self.apply(run_id, "run_created", deploymentId=deployment, workflowName=workflow, input=input)

    def start_run(self, run_id):
        return self.apply(run_id, "run_started")


def test_waitress_serves_the_waterfall_fragments_stream_viewer_and_download(tmp_path):
    assert hashlib.sha256(HTMX.read_bytes()).hexdigest() == HTMX_SHA256
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with api_server("waitress", db_url, tmp_path, tmp_path / "waitress.log") as (url, secret, _):
            world = WorldClient(url, secret)
            story = play_run(HttpSequence(world), lambda ms: None, "wrun_server53", steps=53, outcome="running")
            chunks = [f"line {i}\n".encode() for i in range(130)]
            for c in chunks:
                world.write_stream("wrun_server53", "strm_log", c)
            resp, jar = admin_login(url)
            assert resp.status_code == 302, resp.text[:300]
            with httpx.Client(base_url=url, headers=cookie_header(jar), timeout=30) as http:
                runs = http.get("/admin/cells/run/", params={"q": "server53"})
                assert runs.status_code == 200
                link = re.search(r'href="(/admin/cells/run/(\d+)/change/)[^"]*"', runs.text)
                assert link, runs.text[:2000]
                pk = link.group(2)
                page = http.get(link.group(1)).text
                chart = page[page.index('id="waterfall"'):page.index('id="steps"')]
                assert chart.count('<div class="wc-wf-row wc-wf-step">') == 53
                assert chart.count('<div class="wc-wf-row wc-wf-wait">') == len(story["waits"])
                assert chart.count("wc-wf-m-retry") == len(story["retried"]) + 1
                # the scripts the page loads are served (htmx byte for byte)
                scripts = re.findall(r'<script src="([^"]+)"', page)
                htmx = [s for s in scripts if "htmx" in s]
                assert htmx and http.get(htmx[0]).content == HTMX.read_bytes()
                assert any("console-live" in s for s in scripts) and all(http.get(s).status_code == 200 for s in scripts)
                # the fragments the pages poll
                live = http.get(f"/admin/cells/run/{pk}/live/")
                assert live.status_code == 200 and live.text.lstrip().startswith('<div id="wc-run-live"')
                fragment_url = re.search(r'<div id="wc-results" hx-get="([^"]+)"', runs.text).group(1).replace("&amp;", "&")
                fragment = http.get(fragment_url)
                assert fragment.status_code == 200 and "wrun_server53" in fragment.text and "<html" not in fragment.text
                # the stream viewer pages through all 130 chunks; the download is all of them
                viewer = http.get(f"/admin/cells/run/{pk}/stream/", params={"name": "strm_log", "from": 100})
                assert viewer.status_code == 200
                assert re.findall(r'<tr id="chunk-(\d+)">', viewer.text) == [str(i) for i in range(100, 130)]
                with http.stream("GET", f"/admin/cells/run/{pk}/stream/download/", params={"name": "strm_log"}) as dl:
                    assert dl.status_code == 200 and dl.headers["content-type"] == "application/octet-stream"
                    body = b"".join(dl.iter_bytes())
                assert body == b"".join(chunks)
                # not logged in: the fragments are not public
                anon = httpx.get(f"{url}/admin/cells/run/{pk}/live/", timeout=20)
                assert anon.status_code == 302 and "/admin/login/" in anon.headers["location"]
