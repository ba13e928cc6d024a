"""gunicorn behind contrib/nginx-gunicorn.conf as the README starts them: the admin login with a
browser's Origin, the client's forwarded-scheme headers replaced, and nginx's own request-line
errors in the protocol's JSON error shape (docs/protocol.md §2.9; docs/http-servers.md).
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.fleet_processes import api_server
from tests.ops.support import admin_login, create_superuser, fresh_database
from tests.rpc.conftest import nginx_front
from tests.rpc.rawhttp import exchange

pytestmark = [pytest.mark.any_database, pytest.mark.slow, pytest.mark.timeout(180)]

#: HSTS is only sent on a request Django takes as secure: its presence shows what the app believed.
FRONT_ENV = {"DJANGO_SECURE_HSTS_SECONDS": "3600"}


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """``http://127.0.0.1:<nginx port>`` in front of gunicorn, with a superuser ``ops``."""
    tmp = tmp_path_factory.mktemp("nginx-front")
    with fresh_database(tmp) as db_url:
        create_superuser(db_url, tmp)
        with api_server("gunicorn", db_url, tmp, tmp / "gunicorn.log", extra_env=FRONT_ENV) as (url, _, _):
            port = int(url.rsplit(":", 1)[1])
            with nginx_front(port) as nginx_port:
                yield f"http://127.0.0.1:{nginx_port}"


def test_admin_login_with_the_browsers_origin_through_nginx(front):
    """The browser sends ``Origin: http://127.0.0.1:<port>``; Django compares it with the Host nginx passes on."""
    resp, _ = admin_login(front, origin=front)
    assert resp.status_code == 302, resp.text[:800]
    assert resp.headers["location"] == "/admin/"


@pytest.mark.parametrize("header", [("X-Forwarded-Proto", "https"), ("X-Forwarded-Ssl", "on"),
                                    ("X-Forwarded-Protocol", "ssl")])
def test_a_client_claiming_https_over_plain_http_is_not_taken_as_secure(front, header):
    resp = httpx.get(f"{front}/admin/login/", headers=dict([header]), timeout=20)
    assert resp.status_code == 200, resp.text[:300]
    assert "strict-transport-security" not in resp.headers
    # and Django's CSRF check still sees http: an https Origin is refused
    login, _ = admin_login(front, origin="https://" + front.removeprefix("http://"))
    assert login.status_code == 403


@pytest.mark.parametrize("target", ["/v1/rpc/index/a%00b/get", "/static/%2e%2e/%2e%2e/etc/passwd",
                                    "/static/admin/css/base.css%00"])
def test_request_line_errors_answer_400_json_never_500(front, target):
    port = int(front.rsplit(":", 1)[1])
    head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    resp = exchange(port, head, half_close=False)
    assert resp is not None and resp.status == 400, resp
    assert resp.headers["content-type"] == "application/json"
    assert json.loads(resp.body) == {"error": {"name": "BadRequest", "message": "malformed HTTP request"}}


def test_the_error_locations_are_not_reachable_from_outside(front):
    for path in ("/_worldcell/bad-request", "/_worldcell/payload-too-large"):
        assert httpx.get(f"{front}{path}", timeout=20).status_code == 404
