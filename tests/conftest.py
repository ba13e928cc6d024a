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


@pytest.fixture
def world_secret(settings):
    settings.WORLD_SECRET = SECRET
    return SECRET


@pytest.fixture
def rpc(world_secret, client) -> RpcClient:
    return RpcClient(client)


@pytest.fixture
def frozen_clock():
    """The server clock stopped at 2026-01-02T03:04:05.678Z; move it with ``advance`` (used by runs and admin tests)."""
    from tests.runs.support import Clock

    fake = Clock(1_767_323_045_678)
    world_clock.set_clock(fake)
    yield fake
    world_clock.set_clock(None)
