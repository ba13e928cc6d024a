"""With the fast path off, django-ninja's routes answer exactly like the fast path."""
import json

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db

CASES = [
    ("GET", "/v1/health", b"", None),
    ("POST", "//v1//health/", b"", None),
    ("GET", "/v1/health/x", b"", None),
    ("GET", "/v1/rpc/runs/x/getRun", b"[]", "Bearer s3cret"),
    ("POST", "/v1/rpc/runs/x/getRun", b"[]", None),
    ("POST", "/v1/rpc/runs/x/getRun", b"[]", "Bearer s3cret"),
    ("POST", "/v1/rpc/nope/x/getRun", b"[]", "Bearer s3cret"),
    ("POST", "/v1/rpc/runs/x/alarm", b"[]", "Bearer s3cret"),
    ("POST", "/v1/rpc/runs/x/getRun", b"{", "Bearer s3cret"),
    ("POST", "/v1/rpc/streams/stream%3Aa%2Fb/getInfo", b"[]", "Bearer s3cret"),
    ("POST", "/v1/rpc/index/index/put", b'["k","v"]', "Bearer s3cret"),
]


def answers(rpc):
    out = []
    for method, path, body, auth in CASES:
        resp = rpc.raw(path, body, method=method, headers={"Authorization": auth})
        out.append((resp.status_code, json.loads(resp.content)))
    return out


def test_it_answers_the_same_through_ninja_and_the_fast_path(rpc):
    fast = answers(rpc)
    with override_settings(WORLDCELL_RPC_FAST_PATH=False):
        slow = answers(rpc)
    assert fast == slow
    assert [status for status, _ in fast] == [200, 200, 404, 404, 401, 200, 404, 404, 400, 200, 200]


def test_it_still_serves_the_openapi_schema_to_staff(admin_client):
    schema = admin_client.get("/v1/openapi.json").json()
    assert "/v1/rpc/{binding}/{name}/{method}" in schema["paths"]
    assert "/v1/health" in schema["paths"]


def test_it_hides_the_docs_from_anonymous_users(client):
    assert client.get("/v1/docs").status_code == 302


def test_it_really_takes_the_ninja_route_when_the_fast_path_is_off(rpc, monkeypatch):
    from ninja.operation import Operation

    calls = []
    original = Operation.run
    monkeypatch.setattr(Operation, "run", lambda self, request, **kw: calls.append(request.path) or original(self, request, **kw))
    with override_settings(WORLDCELL_RPC_FAST_PATH=False):
        rpc.raw("/v1/health", b"", method="GET")
    with override_settings(WORLDCELL_RPC_FAST_PATH=True):
        rpc.raw("/v1/health", b"", method="GET")
    assert calls == ["/v1/health"]  # only the first request went through a ninja operation
