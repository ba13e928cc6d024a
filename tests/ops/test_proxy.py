"""Admin login behind a TLS-terminating proxy (issue 12 part 2, docs/operations.md "Behind a proxy").

The API runs as README.md starts it (waitress; with README's proxy flags, which make waitress
keep the proxy's ``X-Forwarded-Proto``, where the test needs a trusted proxy); our own proxy
on 127.0.0.1 adds ``X-Forwarded-Proto: https``; the browser's view is ``https://<proxy host>``.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.fleet_processes import celery_fleet
from tests.ops.proxy import https_terminating_proxy
from tests.ops.support import admin_login, cookie_header, create_superuser, fresh_database

pytestmark = [pytest.mark.any_database, pytest.mark.slow]

#: gunicorn itself trusts X-Forwarded-Proto from 127.0.0.1 (its ``forwarded_allow_ips`` default);
#: these tests stand for a proxy on another host, so gunicorn must not, and Django's setting decides.
REMOTE_PROXY = {"FORWARDED_ALLOW_IPS": "10.255.255.1"}
#: waitress clears every X-Forwarded-* header unless told which proxy sends them (README.md
#: "Behind a TLS-terminating proxy"); the test proxy stands for that trusted proxy
WAITRESS_BEHIND_PROXY = ("--trusted-proxy", "127.0.0.1", "--trusted-proxy-headers", "x-forwarded-proto")


def _public_origin(proxy_url: str) -> str:
    return "https://" + urlsplit(proxy_url).netloc


def test_admin_login_through_a_tls_terminating_proxy(tmp_path, broker_url):
    env = {**REMOTE_PROXY, "DJANGO_SECURE_PROXY_SSL_HEADER": "true", "DJANGO_SECURE_COOKIES": "true",
           "DJANGO_SECURE_HSTS_SECONDS": "3600"}
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with celery_fleet(db_url, tmp_path, tmp_path, broker_url, extra_env=env, processes=("api",),
                          api_args=WAITRESS_BEHIND_PROXY) as (url, _, _):
            with https_terminating_proxy(url) as proxy:
                resp, jar = admin_login(proxy, origin=_public_origin(proxy))
                assert resp.status_code == 302, resp.text[:800]
                assert resp.headers["location"] == "/admin/"
                session_cookies = [h for h in resp.headers.get_list("set-cookie") if h.startswith("sessionid=")]
                assert session_cookies and "Secure" in session_cookies[0] and "HttpOnly" in session_cookies[0]
                assert resp.headers["strict-transport-security"] == "max-age=3600"
                index = httpx.get(f"{proxy}/admin/", headers=cookie_header(jar), timeout=20)
                assert index.status_code == 200 and 'id="logout-form"' in index.text
                # straight to gunicorn (no proxy, plain http): no HSTS, the request is not secure
                direct = httpx.get(f"{url}/admin/login/", timeout=20)
                assert "strict-transport-security" not in direct.headers


def test_without_the_proxy_header_setting_the_https_origin_is_refused(tmp_path, broker_url):
    """SECURE_PROXY_SSL_HEADER is opt-in: without it (or CSRF_TRUSTED_ORIGINS) Django sees http and refuses the https Origin."""
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        with celery_fleet(db_url, tmp_path, tmp_path, broker_url, processes=("api",), extra_env=REMOTE_PROXY) as (url, _, _):
            with https_terminating_proxy(url) as proxy:
                resp, _ = admin_login(proxy, origin=_public_origin(proxy))
                assert resp.status_code == 403 and "CSRF" in resp.text


def test_csrf_trusted_origins_admits_the_public_origin(tmp_path, broker_url):
    with fresh_database(tmp_path) as db_url:
        create_superuser(db_url, tmp_path)
        env = {**REMOTE_PROXY, "DJANGO_CSRF_TRUSTED_ORIGINS": "https://fleet.example"}
        with celery_fleet(db_url, tmp_path, tmp_path, broker_url, processes=("api",), extra_env=env) as (url, _, _):
            resp, _ = admin_login(url, origin="https://fleet.example")
            assert resp.status_code == 302, resp.text[:800]
            resp, _ = admin_login(url, origin="https://evil.example")
            assert resp.status_code == 403
