"""Admin login behind a TLS-terminating proxy (issue 12 part 2, docs/operations.md "Behind a proxy").

waitress runs as README.md starts it (plus, where the test says so, the trusted-proxy flags
README.md "Behind a TLS-terminating proxy" gives); our own proxy on 127.0.0.1 adds
``X-Forwarded-Proto: https``; the browser's view is ``https://<proxy host>``.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.fleet_processes import celery_fleet
from tests.ops.proxy import https_terminating_proxy
from tests.ops.support import admin_login, cookie_header, create_superuser, fresh_database

pytestmark = pytest.mark.slow

#: waitress drops X-Forwarded-* from every peer it was not told to trust (its
#: ``clear_untrusted_proxy_headers`` default); README.md's flags for a proxy on 127.0.0.1:
TRUST_LOCAL_PROXY = ("--trusted-proxy", "127.0.0.1", "--trusted-proxy-headers", "x-forwarded-proto")
#: for the gunicorn alternative: gunicorn trusts X-Forwarded-Proto from 127.0.0.1 by itself (its
#: ``forwarded_allow_ips`` default); these tests stand for an untrusted peer, so it must not.
REMOTE_PROXY = {"FORWARDED_ALLOW_IPS": "10.255.255.1"}
BROKER = f"redis://127.0.0.1:6379/{int(os.environ.get('TEST_REDIS_DB_BASE', '5')) + 1}"


def _public_origin(proxy_url: str) -> str:
    return "https://" + urlsplit(proxy_url).netloc


def test_admin_login_through_a_tls_terminating_proxy(tmp_path):
    env = {**REMOTE_PROXY, "DJANGO_SECURE_PROXY_SSL_HEADER": "true", "DJANGO_SECURE_COOKIES": "true",
           "DJANGO_SECURE_HSTS_SECONDS": "3600"}
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with celery_fleet(db_url, tmp_path, tmp_path, BROKER, extra_env=env, processes=("api",),
                          api_args=TRUST_LOCAL_PROXY) as (url, _, _):
            with https_terminating_proxy(url) as proxy:
                resp, jar = admin_login(proxy, origin=_public_origin(proxy))
                assert resp.status_code == 302, resp.text[:800]
                assert resp.headers["location"] == "/admin/"
                session_cookies = [h for h in resp.headers.get_list("set-cookie") if h.startswith("sessionid=")]
                assert session_cookies and "Secure" in session_cookies[0] and "HttpOnly" in session_cookies[0]
                assert resp.headers["strict-transport-security"] == "max-age=3600"
                index = httpx.get(f"{proxy}/admin/", headers=cookie_header(jar), timeout=20)
                assert index.status_code == 200 and 'id="logout-form"' in index.text
                # straight to waitress (no proxy, plain http): no HSTS, the request is not secure
                direct = httpx.get(f"{url}/admin/login/", timeout=20)
                assert "strict-transport-security" not in direct.headers


@pytest.mark.parametrize("api", ["waitress", "gunicorn"])
def test_without_trusting_the_proxy_the_https_origin_is_refused(api, tmp_path):
    """Trust is opt-in: a server not told to trust the proxy (waitress without --trusted-proxy,
    gunicorn with the peer outside FORWARDED_ALLOW_IPS) and Django without SECURE_PROXY_SSL_HEADER
    see http, and refuse the https Origin."""
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with celery_fleet(db_url, tmp_path, tmp_path, BROKER, processes=("api",), extra_env=REMOTE_PROXY,
                          api=api) as (url, _, _):
            with https_terminating_proxy(url) as proxy:
                resp, _ = admin_login(proxy, origin=_public_origin(proxy))
                assert resp.status_code == 403 and "CSRF" in resp.text


def test_csrf_trusted_origins_admits_the_public_origin(tmp_path):
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        env = {**REMOTE_PROXY, "DJANGO_CSRF_TRUSTED_ORIGINS": "https://fleet.example"}
        with celery_fleet(db_url, tmp_path, tmp_path, BROKER, processes=("api",), extra_env=env) as (url, _, _):
            resp, _ = admin_login(url, origin="https://fleet.example")
            assert resp.status_code == 302, resp.text[:800]
            resp, _ = admin_login(url, origin="https://evil.example")
            assert resp.status_code == 403
