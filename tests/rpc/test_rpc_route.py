"""The RPC route's body handling, name decoding and error mapping (docs/protocol.md §2.2, §2.6–2.9)."""
import json

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from worldcell import dispatch, rpc as rpc_module

pytestmark = pytest.mark.django_db

CAP = rpc_module.MAX_BODY_BYTES


def test_it_accepts_a_body_of_exactly_32_mib(rpc):
    body = b"[" + b" " * (CAP - 2) + b"]"
    assert len(body) == CAP
    resp = rpc.raw("/v1/rpc/runs/wrun_cap/getRun", body)
    assert resp.status_code == 200, resp.content[:200]
    assert resp.content == b"null"


def test_it_refuses_one_byte_more_with_413(rpc):
    body = b"[" + b" " * (CAP - 1) + b"]"
    resp = rpc.raw("/v1/rpc/runs/wrun_cap/getRun", body)
    assert resp.status_code == 413
    assert resp.content == b'{"error":{"name":"PayloadTooLarge","message":"body exceeds 33554432 bytes"}}'


def test_it_checks_content_length_before_reading(rpc):
    resp = rpc.raw("/v1/rpc/runs/x/getRun", b"[]", headers={"Content-Length": str(CAP + 1)})
    assert resp.status_code == 413


def test_it_ignores_a_non_numeric_content_length(rpc):
    resp = rpc.raw("/v1/rpc/runs/x/getRun", b"[]", headers={"Content-Length": "abc"})
    assert resp.status_code in (200, 400)  # check 9 ignored: the (empty) body is then judged


def test_it_checks_the_method_before_the_body_size(rpc):
    resp = rpc.raw("/v1/rpc/runs/x/nope", b"[]", headers={"Content-Length": str(CAP + 1)})
    assert resp.status_code == 404


@pytest.mark.parametrize("body", [b"", b"[", b"{", b'[{"__type":"Uint8Array","data":"!!!"}]', b"[NaN]"])
def test_it_answers_malformed_bodies_with_400(rpc, body):
    resp = rpc.raw("/v1/rpc/runs/x/getRun", body)
    assert resp.status_code == 400
    assert resp.content == b'{"error":{"name":"BadRequest","message":"malformed rpc body"}}'


@pytest.mark.parametrize("body", [b'{"not":"an array"}', b"1", b'"x"', b"null"])
def test_it_wants_an_argument_array(rpc, body):
    resp = rpc.raw("/v1/rpc/runs/x/getRun", body)
    assert resp.status_code == 400
    assert resp.content == b'{"error":{"name":"BadRequest","message":"body must be an argument array"}}'


@pytest.mark.parametrize("segment", ["%E0%A4%A", "%", "abc%zz", "%C3%28"])
def test_it_answers_malformed_name_escapes_with_400(rpc, segment):
    resp = rpc.raw(f"/v1/rpc/runs/{segment}/getRun", b"[]")
    assert resp.status_code == 400
    assert json.loads(resp.content) == {
        "error": {"name": "BadRequest", "message": "malformed percent-encoding in cell name"}
    }


@pytest.mark.parametrize(
    "encoded,decoded",
    [("stream%3Aa%2Fb", "stream:a/b"), ("a%25b", "a%b"), ("a%20b", "a b"), ("a+b", "a+b"),
     ("%E2%9C%93%F0%9F%98%80", "\u2713\U0001F600")],
)
def test_it_decodes_only_the_name_segment(encoded, decoded):
    assert rpc_module.decode_cell_name(encoded) == decoded


def test_it_routes_on_the_raw_path_with_encoded_slashes(rpc, monkeypatch):
    seen = []

    class Probe:
        def __init__(self, name, tenant="default"):
            seen.append(name)

        def get_info(self):
            return {"tailIndex": -1, "done": False}

    monkeypatch.setitem(dispatch._REGISTRY, "streams", dispatch.Binding("streams", Probe, {"getInfo": "get_info"}, {"getInfo": 0}))
    assert rpc.raw("//v1//rpc//streams//stream%3Aa%2Fb//getInfo", b"[]").status_code == 200
    assert rpc.raw("/v1/rpc/streams/stream%3Aa%2Fb/getInfo", b"[]").status_code == 200
    assert seen == ["stream:a/b", "stream:a/b"]


def test_it_reports_raised_errors_as_500_with_their_name(rpc, monkeypatch):
    from worldcell.errors import CellError, ValidationError

    class Boom:
        def __init__(self, name, tenant="default"):
            self.name = name

        def get(self, key=None):
            if key == "cell":
                raise CellError("Cannot write to a closed stream")
            if key == "valid":
                raise ValidationError("key: must be a string")
            if key == "status":
                err = RuntimeError("teapot")
                err.status = 418
                raise err
            if key == "nothing":
                return None
            raise KeyError("internal detail")

    monkeypatch.setitem(dispatch._REGISTRY, "index", dispatch.Binding("index", Boom, {"get": "get"}, {"get": 1}))
    resp = rpc.call_raw("index", "index", "get", "cell")
    assert (resp.status_code, resp.content) == (500, b'{"error":{"name":"Error","message":"Cannot write to a closed stream"}}')
    resp = rpc.call_raw("index", "index", "get", "valid")
    assert (resp.status_code, resp.content) == (400, b'{"error":{"name":"ValidationError","message":"key: must be a string"}}')
    resp = rpc.call_raw("index", "index", "get", "status")
    assert resp.status_code == 500 and json.loads(resp.content) == {"error": {"name": "RuntimeError", "message": "teapot", "status": 418}}
    resp = rpc.call_raw("index", "index", "get", "other")
    assert resp.status_code == 500 and json.loads(resp.content)["error"]["name"] == "KeyError"
    assert b"Traceback" not in resp.content
    resp = rpc.call_raw("index", "index", "get", "nothing", "extra", "args", "ignored")
    assert (resp.status_code, resp.content) == (200, b"null")


# ---------------------------------------------------------------------------- fuzz

segment = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
json_args = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6),
              st.sampled_from([{"__type": "Uint8Array", "data": "AAE="}, {"__type": "Date", "iso": "2026-01-01T00:00:00Z"}])),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(
        st.sampled_from(["limit", "cursor", "startIndex", "prefix", "reverse", "eventType", "data", "runId",
                         "correlationId", "eventData", "sortOrder", "messageId", "config", "x"]), c, max_size=4)),
    max_leaves=12,
)
ALL_METHODS = [(b, m) for b, methods in dispatch.KNOWN_BINDINGS.items() for m in sorted(methods)]


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(segment, max_size=6),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    body=st.binary(max_size=64),
    auth=st.sampled_from([None, "Bearer s3cret", "Bearer x", "bearer s3cret"]),
)
def test_it_never_answers_random_requests_with_a_500(rpc, parts, method, body, auth):
    from urllib.parse import quote

    path = "/" + "/".join(quote(p, safe="") for p in parts)
    resp = rpc.raw(path, body, method=method, headers={"Authorization": auth})
    assert resp.status_code < 500 or resp.status_code == 503
    assert b"Traceback" not in resp.content
    json.loads(resp.content)


@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(ALL_METHODS), args=st.lists(json_args, max_size=4))
def test_it_never_answers_bad_arguments_with_a_500(rpc, target, args):
    binding, method = target
    if dispatch.lookup(binding, method) is None:
        return  # binding not implemented yet
    name = {"queue": "q:0", "index": "index", "streams": "stream:fuzz", "runs": "wrun_fuzz"}[binding]
    resp = rpc.call_raw(binding, name, method, *args)
    body = json.loads(resp.content)
    if resp.status_code == 500:
        # Only the upstream errors docs/protocol.md §2.8 lists may be 500s.
        assert body["error"]["name"] in ("Error", "SyntaxError"), body
    assert b"Traceback" not in resp.content


def test_it_reads_raw_non_ascii_name_bytes_as_utf8():
    # gunicorn hands over raw request bytes decoded as latin-1 (PEP 3333)
    raw = "日".encode("utf-8").decode("latin-1")
    assert rpc_module.decode_cell_name(raw) == "日"
    assert rpc_module.decode_cell_name("\xff\xfe") is None  # not UTF-8: 400


def test_it_answers_head_requests_without_a_body(world_secret, rf):
    # Called directly: Django's test client would strip a HEAD body by itself.
    resp = rpc_module.handle(rf.head("/v1/health"))
    assert resp.status_code == 200 and resp.content == b""
    resp = rpc_module.handle(rf.head("/v1/rpc/runs/x/getRun"))
    assert resp.status_code == 401 and resp.content == b""
    assert rpc_module.handle(rf.get("/v1/health")).content == rpc_module.HEALTH_BODY
