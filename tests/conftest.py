"""Shared fixtures: an in-process RPC client that behaves like the JS client.

``rpc(binding, name, method, *args)`` POSTs the codec-encoded argument array to
``/v1/rpc/{binding}/{encodeURIComponent(name)}/{method}`` with the bearer
secret and returns ``(status, decoded_body)``. The raw request target is
passed as ``RAW_URI`` exactly as gunicorn does, so the router sees ``%2F``.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings as dj_settings
from django.test import Client

from tests.services import session_redis
from worldcell import clock as world_clock
from worldcell import codec

SECRET = "s3cret"


def is_postgres() -> bool:
    return dj_settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def encode_component(name: str) -> str:
    """JavaScript ``encodeURIComponent``."""
    return quote(name, safe="-_.!~*'()")


class RpcClient:
    """Calls the RPC route in-process through Django's test client."""

    def __init__(self, client: Client, secret: str = SECRET):
        self.client = client
        self.secret = secret

    def raw(self, path: str, body: bytes | str = b"[]", method: str = "POST", headers: dict | None = None):
        extra = {"RAW_URI": path}
        if self.secret is not None:
            extra["HTTP_AUTHORIZATION"] = f"Bearer {self.secret}"
        for k, v in (headers or {}).items():
            key = k.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            if v is None:
                extra.pop(key, None)
            else:
                extra[key] = v
        from urllib.parse import unquote

        # The router reads RAW_URI; the test client only needs a path it can parse
        # (a leading "//" would make urllib read a network location).
        django_path = "/" + unquote(path).lstrip("/")
        return self.client.generic(method, django_path, body, content_type="application/json", **extra)

    def call_raw(self, binding: str, name: str, method: str, *args: Any):
        path = f"/v1/rpc/{binding}/{encode_component(name)}/{method}"
        return self.raw(path, codec.encode(list(args)))

    def __call__(self, binding: str, name: str, method: str, *args: Any) -> tuple[int, Any]:
        resp = self.call_raw(binding, name, method, *args)
        return resp.status_code, codec.decode(resp.content)

    def ok(self, binding: str, name: str, method: str, *args: Any) -> Any:
        """Call and assert HTTP 200; returns the decoded result."""
        status, body = self(binding, name, method, *args)
        assert status == 200, (status, body)
        return body


def record_statements(monkeypatch, cursor_class) -> list[str]:
    """Record the text of every statement sent through ``cursor_class.execute`` (a psycopg cursor class)
    until ``monkeypatch`` is undone; returns the list it appends to."""
    sent: list[str] = []
    execute = cursor_class.execute

    def recording(cur, query, params=None, **kwargs):
        sent.append(str(query))
        return execute(cur, query, params, **kwargs)

    monkeypatch.setattr(cursor_class, "execute", recording)
    return sent


@pytest.fixture(scope="session", autouse=True)
def fast_password_hasher():
    """In-process tests hash passwords with one MD5 round instead of PBKDF2's million (Django's own advice
    for test suites): creating the admin user of a console test cost 0.27 s of CPU, a third of the
    console tests' time. Servers the tests start as subprocesses keep the production hasher."""
    from django.test.utils import override_settings

    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    fast.enable()  # sends setting_changed, which empties Django's cached hasher list
    yield
    fast.disable()


@pytest.fixture(scope="session", autouse=True)
def static_files_described_once():
    """Every test client builds the middleware chain anew, and whitenoise then stats and describes each of
    the apps' ~140 static files again (33 ms of CPU per client, 12 % of the in-process tests' time). Its
    description of a file depends only on the file and the settings, which no in-process test changes,
    so this test process makes each one once and hands the same object to every later middleware."""
    from worldcell.staticfiles import StaticFilesMiddleware

    made: dict[tuple[str, str], object] = {}
    original = StaticFilesMiddleware.get_static_file

    def get_static_file(self, path, url, stat_cache=None):
        if (path, url) not in made:
            made[(path, url)] = original(self, path, url, stat_cache=stat_cache)
        return made[(path, url)]

    StaticFilesMiddleware.get_static_file = get_static_file
    yield
    StaticFilesMiddleware.get_static_file = original


@pytest.fixture
def world_secret(settings):
    settings.WORLD_SECRET = SECRET
    return SECRET


@pytest.fixture
def rpc(world_secret, client) -> RpcClient:
    return RpcClient(client)


@pytest.fixture
def two_tenants(rpc, client, monkeypatch):
    """``(default, other)``: RPC clients of the default tenant (``WORLD_SECRET``) and of a second
    tenant ``other`` (a stored secret), for the isolation tests (docs/tenants.md)."""
    from worldcell import credentials
    from worldcell.models import Tenant

    monkeypatch.setattr(credentials._snapshot, "_maybe_touch", lambda: None)
    credentials.forget()
    Tenant.objects.create(slug="other", name="another app")
    secret, _ = credentials.add_secret("other", "other app")
    yield rpc, RpcClient(client, secret)
    credentials.forget()


@pytest.fixture
def broker_url() -> str:
    """The broker of a Celery test: this test process's own redis-server (``tests.services.session_redis``),
    emptied first, so parallel sessions and xdist workers never share one."""
    import redis

    url = session_redis().url
    redis.Redis.from_url(url).flushall()
    return url


@pytest.fixture
def frozen_clock():
    """The server clock stopped at 2026-01-02T03:04:05.678Z; move it with ``advance`` (used by runs and admin tests)."""
    from tests.runs.support import Clock

    fake = Clock(1_767_323_045_678)
    world_clock.set_clock(fake)
    yield fake
    world_clock.set_clock(None)


# --------------------------------------------------------------------------- order and the duration guard

#: a test whose call takes longer than this must carry ``@pytest.mark.slow(reason="…")`` (README.md "Tests")
GUARD_S = 30.0


def _slow_reason(item) -> str | None:
    for mark in item.iter_markers("slow"):
        if mark.kwargs.get("reason"):
            return mark.kwargs["reason"]
    return None


def pytest_collection_modifyitems(session, config, items):
    """Modules with slow (process-level) tests first, in a stable order.

    Under xdist (``--dist loadfile``) the longest files then start first and the
    short ones fill the workers' gaps instead of one long file running alone at
    the end. Every worker sorts the same way, as xdist requires.
    """
    first: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        rank = 0 if _slow_reason(item) else (1 if item.get_closest_marker("slow") else 2)
        first[module] = min(first.get(module, 3), rank)
    items.sort(key=lambda item: first[item.nodeid.split("::", 1)[0]])
    for item in items:
        for mark in item.iter_markers("slow"):
            if "reason" in mark.kwargs and not str(mark.kwargs["reason"]).strip():
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow(reason=...) needs a one-line reason")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        # user_properties travel with the report from an xdist worker to the controller
        report.user_properties.append(("slow_reason", _slow_reason(item) or ""))


_over_guard: list[tuple[float, str, str]] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.duration > GUARD_S:
        reason = dict(report.user_properties).get("slow_reason", "")
        _over_guard.append((report.duration, report.nodeid, reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _over_guard:
        return
    unmarked = [(d, n) for d, n, reason in _over_guard if not reason]
    terminalreporter.section(f"tests over {GUARD_S:.0f} s")
    for duration, nodeid, reason in sorted(_over_guard, reverse=True):
        terminalreporter.write_line(f"{duration:6.1f}s {nodeid}  [{reason or 'NO slow(reason=...) MARKER'}]")
    if unmarked:
        terminalreporter.write_line(
            f"duration guard: {len(unmarked)} test(s) took over {GUARD_S:.0f} s without "
            "@pytest.mark.slow(reason=...): give each a reason or make it faster", red=True, bold=True)
