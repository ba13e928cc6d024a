"""The run actions through a real API server started as README.md starts it (waitress), logged in like a person.

Re-run submitted twice starts ONE run; two concurrent Re-enqueue POSTs send ONE message (the server's
threads really run them at once). Data goes in and is checked over the RPC route (worldcell_client).
"""
from __future__ import annotations

import re
import subprocess
import threading

import httpx
import pytest

from tests.e2e.fleet_processes import PY, ROOT, api_server, base_env, fresh_database
from tests.services import refused_url
from worldcell_client import WorldClient

pytestmark = pytest.mark.slow  # starts fleet processes

TARGET = refused_url()  # nothing listens there (tests/services.py)
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def _run(world: WorldClient, run_id: str, *, finish: bool) -> None:
    world.apply_event(run_id, {"eventType": "run_created", "eventData": {
        "deploymentId": "dpl_w", "workflowName": "wf", "input": [b"\x01\x02", "x"]}})
    world.enqueue("__wkf_workflow_wf", {"runId": run_id, "traceCarrier": {}}, target_base_url=TARGET)
    world.apply_event(run_id, {"eventType": "run_started"})
    if finish:
        world.apply_event(run_id, {"eventType": "run_failed", "eventData": {"error": {"message": "boom"}}})


def _login(base: str, data_dir, db_url: str) -> httpx.Client:
    env = base_env(db_url, "unused", data_dir, DJANGO_SUPERUSER_PASSWORD="pw-ops-123",
                   DJANGO_SUPERUSER_USERNAME="ops", DJANGO_SUPERUSER_EMAIL="ops@example.test")
    subprocess.run([PY, "manage.py", "createsuperuser", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    http = httpx.Client(base_url=base, timeout=30)
    token = CSRF.search(http.get("/admin/login/").text).group(1)
    done = http.post("/admin/login/?next=/admin/", data={"username": "ops", "password": "pw-ops-123",
                                                        "csrfmiddlewaretoken": token, "next": "/admin/"})
    assert done.status_code == 302 and done.headers["location"] == "/admin/", done.text[:300]
    return http


def _page_of(http: httpx.Client, run_id: str) -> str:
    found = http.get(f"/admin/cells/run/by-id/{run_id}/")
    assert found.status_code == 302
    return found.headers["location"]


def test_rerun_and_reenqueue_through_waitress(tmp_path):
    with fresh_database(tmp_path) as url, \
            api_server("waitress", url, tmp_path, tmp_path / "waitress.log") as (base, secret, _):
        world = WorldClient(base, secret)
        _run(world, "wrun_w1", finish=True)
        _run(world, "wrun_w2", finish=False)
        pending = world.call("queue", "q:0", "stats")["pending"]
        assert pending == 2  # no pump: the app's two messages stay stored
        http = _login(base, tmp_path, url)

        page = _page_of(http, "wrun_w1")
        assert "Re-run…" in http.get(page).text
        confirm = http.get(page.replace("/change/", "/rerun/")).text
        assert "run_created" in confirm and TARGET in confirm
        form = {"csrfmiddlewaretoken": CSRF.search(confirm).group(1), "post": "yes",
                "request_key": re.search(r'name="request_key" value="([0-9A-Z]{26})"', confirm).group(1)}
        first = http.post(page.replace("/change/", "/rerun/"), data=form)
        again = http.post(page.replace("/change/", "/rerun/"), data=form)  # the form submitted twice
        assert first.status_code == again.status_code == 302
        new_page = http.get(first.headers["location"]).text
        new = re.search(r"<h1>Run (wrun_[0-9A-Z]{26})</h1>", new_page).group(1)
        assert 'Re-run of <a href="/admin/cells/run/by-id/wrun_w1/">wrun_w1</a>' in new_page
        assert again.headers["location"] == page  # the second one started nothing: back on the original
        assert "already re-run by this request as " + new in new_page  # (both messages show on the next page)
        run = world.call("runs", new, "getRun")
        assert (run["status"], run["workflowName"], run["deploymentId"], run["input"]) == (
            "pending", "wf", "dpl_w", [b"\x01\x02", "x"])
        assert [e["eventType"] for e in world.call("runs", new, "listEvents", {})["data"]] == ["run_created"]
        assert world.call("queue", "q:0", "stats")["pending"] == pending + 1

        page2 = _page_of(http, "wrun_w2").replace("/change/", "/reenqueue/")
        token = CSRF.search(http.get(page2).text).group(1)
        barrier = threading.Barrier(2)
        codes: list[int] = []

        def click() -> None:
            barrier.wait(5)
            codes.append(http.post(page2, data={"csrfmiddlewaretoken": token, "post": "yes"}).status_code)

        threads = [threading.Thread(target=click) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert codes == [302, 302]
        assert world.call("queue", "q:0", "stats")["pending"] == pending + 2  # one more message, not two
        later = http.get(_page_of(http, "wrun_w2").replace("/change/", "/reenqueue/")).text
        assert "Already re-enqueued in this state" in later
