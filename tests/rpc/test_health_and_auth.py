"""The fixed surface of docs/protocol.md §2.2–2.4 (acceptance §11.1)."""
import json

import pytest

from worldcell.rpc import HEALTH_BODY

pytestmark = pytest.mark.django_db


def test_it_answers_health_to_any_method_without_auth(rpc):
    rpc.secret = None
    for method in ("GET", "POST", "DELETE"):
        resp = rpc.raw("/v1/health", method=method)
        assert resp.status_code == 200
        assert resp.content == HEALTH_BODY
        assert resp["content-type"] == "application/json"
    assert json.loads(HEALTH_BODY) == {"ok": True, "name": "world-celld", "version": "0.1.0", "specVersion": 3}


@pytest.mark.parametrize("path", ["/v1/health/", "//v1//health", "/v1//health//"])
def test_it_ignores_empty_segments_for_health(rpc, path):
    assert rpc.raw(path, method="GET").content == HEALTH_BODY


@pytest.mark.parametrize("path", ["/", "/v1", "/v2/health", "/v1/health/x", "/v1/foo"])
def test_it_answers_unknown_paths_with_the_raw_path(rpc, path):
    resp = rpc.raw(path, method="GET")
    assert resp.status_code == 404
    assert resp.content == json.dumps(
        {"error": {"name": "NotFound", "message": f"unknown path: {path}"}}, separators=(",", ":")
    ).encode()


def test_it_fails_closed_without_a_secret(rpc, settings):
    settings.WORLD_SECRET = ""
    resp = rpc.raw("/v1/rpc/nope/x/whatever", body=b"garbage")
    assert resp.status_code == 503
    assert resp.content == b'{"error":{"name":"WorldNotConfigured","message":"WORLD_SECRET is not configured"}}'


@pytest.mark.parametrize(
    "header", [None, "Bearer wrong", "bearer s3cret", "Basic s3cret", "Bearer  s3cret", "Bearer ", "s3cret"]
)
def test_it_refuses_a_missing_or_wrong_token(rpc, header):
    resp = rpc.raw("/v1/rpc/nope/x/getRun", headers={"Authorization": header})
    assert resp.status_code == 401
    assert resp.content == b'{"error":{"name":"Unauthorized","message":"invalid or missing bearer token"}}'


def test_it_authenticates_before_checking_the_shape(rpc):
    rpc.secret = None
    assert rpc.raw("/v1/rpc/nope", method="GET").status_code == 401


@pytest.mark.parametrize("method,path", [("GET", "/v1/rpc/runs/x/getRun"), ("POST", "/v1/rpc/runs/x")])
def test_it_wants_post_and_five_segments(rpc, method, path):
    resp = rpc.raw(path, method=method)
    assert resp.status_code == 404
    assert resp.content == (
        b'{"error":{"name":"NotFound","message":"expected POST /v1/rpc/{binding}/{name}/{method}"}}'
    )


@pytest.mark.parametrize("binding", ["nope", "constructor", "__proto__", "toString", "run%73"])
def test_it_404s_unknown_bindings(rpc, binding):
    resp = rpc.raw(f"/v1/rpc/{binding}/x/getRun")
    assert resp.status_code == 404
    assert json.loads(resp.content) == {"error": {"name": "NotFound", "message": f"unknown binding: {binding}"}}


@pytest.mark.parametrize("method", ["fetch", "alarm", "constructor", "__proto__", "claimInflight", "_private"])
def test_it_404s_methods_outside_the_whitelist(rpc, method):
    resp = rpc.raw(f"/v1/rpc/runs/wrun_x/{method}")
    assert resp.status_code == 404
    assert json.loads(resp.content)["error"]["message"] == f"unknown method: runs.{method}"
