"""The console's static files through the real WSGI servers (issue 12 part 1, docs/operations.md "Static files").

devfleet (waitress) and gunicorn are started exactly as README.md says, each
on its own fresh database; the admin login page, its CSS (by the hashed name
the page links) and the ``/v1/docs`` page's JS must all answer 200.
"""
from __future__ import annotations

import re

import httpx
import pytest

from tests.e2e.fleet_processes import celery_fleet, dev_fleet
from tests.ops.support import admin_login, cookie_header, create_superuser, fresh_database, suite_is_postgres

pytestmark = [pytest.mark.any_database, pytest.mark.slow]


def _assert_static(url: str, path: str, content_type: str) -> httpx.Response:
    resp = httpx.get(f"{url}{path}", timeout=20)
    assert resp.status_code == 200, f"{path} -> {resp.status_code}"
    assert resp.headers["content-type"].startswith(content_type), (path, resp.headers["content-type"])
    assert len(resp.content) > 500
    return resp


def _check_console(url: str) -> None:
    page = httpx.get(f"{url}/admin/login/", timeout=20)
    assert page.status_code == 200
    css = re.findall(r'href="(/static/[^"]+\.css)"', page.text)
    assert any(re.fullmatch(r"/static/admin/css/base\.[0-9a-f]{12}\.css", p) for p in css), css
    for path in css:
        resp = _assert_static(url, path, "text/css")
        assert "immutable" in resp.headers.get("cache-control", "") or "max-age=315360000" in resp.headers.get("cache-control", "")
    # the plain name works too (a bookmarked or hand-typed URL), and gzip is served when asked for
    _assert_static(url, "/static/admin/css/base.css", "text/css")
    gz = httpx.get(f"{url}/static/admin/css/base.css", headers={"Accept-Encoding": "gzip"}, timeout=20)
    assert gz.headers.get("content-encoding") == "gzip"

    resp, jar = admin_login(url)
    assert resp.status_code == 302 and resp.headers["location"] == "/admin/", resp.text[:500]
    docs = httpx.get(f"{url}/v1/docs", headers=cookie_header(jar), timeout=20)
    assert docs.status_code == 200, docs.text[:300]
    scripts = re.findall(r'<script src="([^"]+)"', docs.text)
    assert any("swagger-ui-bundle" in s for s in scripts), scripts
    for path in scripts:
        _assert_static(url, path, "text/javascript")
    for path in re.findall(r'href="(/static/[^"]+\.css)"', docs.text):
        _assert_static(url, path, "text/css")
    schema = httpx.get(f"{url}/v1/openapi.json", headers=cookie_header(jar), timeout=20)
    assert schema.status_code == 200 and schema.json()["paths"]


def test_devfleet_serves_the_console_static_files(tmp_path):
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with dev_fleet(db_url, tmp_path, tmp_path / "devfleet.log") as (url, _, _):
            _check_console(url)
    assert (tmp_path / "static" / "staticfiles.json").exists(), "devfleet did not collect the static files"


@pytest.mark.postgres_only
def test_gunicorn_serves_the_console_static_files(tmp_path, broker_url):
    assert suite_is_postgres()
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with celery_fleet(db_url, tmp_path, tmp_path, broker_url, processes=("api",), api="gunicorn") as (url, _, _):
            _check_console(url)
