"""What the hook-token methods answer when a ``hook:`` / ``hookid:`` / ``hookclaim:`` value is not
what the client writes (docs/protocol.md §6.3 "Values the client did not write").

Upstream reads a published hook with ``JSON.parse(value)``, and ``JSON.parse`` first turns a value
that is not a string into one with ``String(value)``: a number, a boolean or ``[5]`` parse (the
hook then has no owner: nothing is deleted, the answer is 200), ``{}`` ("[object Object]") or
``"not json"`` do not (500 ``SyntaxError``, nothing written), ``null`` parses to ``null`` and
reading its ``runId`` fails (500 ``TypeError``). A claim is read as stored: one without an
``owner`` object fails reading ``owner.runId`` (500 ``TypeError``). Always a JSON answer, never a
half-done transaction.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytestmark = pytest.mark.django_db

A = {"runId": "wrun_A", "hookId": "h1"}
METHODS = {
    "reserveHookToken": ["tok", A],
    "finalizeHookIndexes": ["tok", "h1", json.dumps({**A, "token": "tok"}), A],
    "releaseHookToken": ["tok", A],
    "deleteHookIndexes": ["tok", "h1", A],
}
DATE = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)

# value stored at hook:tok -> what String(value) gives to JSON.parse upstream, and the outcome
PUBLISHED = [
    (5, "parses"), (1.5, "parses"), (1e21, "parses"), (True, "parses"), (False, "parses"),
    ([5], "parses"), (["5"], "parses"), ([[1]], "parses"), (b"\x05", "parses"), ('{"runId": 1}', "parses"),
    ("7", "parses"), ('"a string"', "parses"),
    ("not json", "SyntaxError"), ({"runId": "wrun_A"}, "SyntaxError"), ([], "SyntaxError"),
    (["a"], "SyntaxError"), ([None], "SyntaxError"), (b"\x01\x02", "SyntaxError"), (DATE, "SyntaxError"),
    ("", "SyntaxError"), (None, "TypeError"), ("null", "TypeError"), ([None, None], "SyntaxError"),
]


def answer(rpc, method):
    resp = rpc.call_raw("index", "index", method, *METHODS[method])
    assert resp["Content-Type"] == "application/json"
    return resp.status_code, json.loads(resp.content)


def put(rpc, key, value):
    rpc.ok("index", "index", "put", key, value)


def stored(rpc, key):
    return rpc.ok("index", "index", "get", key)


@pytest.mark.parametrize("value,outcome", PUBLISHED, ids=[repr(v)[:24] for v, _ in PUBLISHED])
@pytest.mark.parametrize("key", ["hook:tok", "hookid:h1"])
def test_delete_hook_indexes_reads_a_published_value_as_upstream_does(rpc, key, value, outcome):
    put(rpc, key, value)
    put(rpc, "hookclaim:tok", {"owner": A, "reservedAt": 1})
    status, body = answer(rpc, "deleteHookIndexes")
    if outcome == "parses":
        # no owner in it: kept; the caller's own claim goes
        assert status == 200 and body is None
        assert stored(rpc, key) == value and stored(rpc, "hookclaim:tok") is None
    else:
        assert status == 500 and body["error"]["name"] == outcome
        assert stored(rpc, key) == value and stored(rpc, "hookclaim:tok") == {"owner": A, "reservedAt": 1}


@pytest.mark.parametrize("value,outcome", PUBLISHED, ids=[repr(v)[:24] for v, _ in PUBLISHED])
def test_reserve_and_finalize_read_a_published_value_as_upstream_does(rpc, value, outcome):
    put(rpc, "hook:tok", value)
    status, body = answer(rpc, "reserveHookToken")
    if outcome == "parses":
        assert (status, body) == (200, {"claimed": False, "holder": {"runId": 1} if value == '{"runId": 1}' else {}})
    else:
        assert status == 500 and body["error"]["name"] == outcome
    status, body = answer(rpc, "finalizeHookIndexes")
    assert status == 500  # another owner's (no owner), or unreadable
    assert body["error"]["name"] == ("Error" if outcome == "parses" else outcome)
    assert stored(rpc, "hook:tok") == value and stored(rpc, "hookid:h1") is None


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.binary(max_size=4) | st.just(DATE),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["runId", "hookId", "owner", "x"]),
                                                                inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES, key=st.sampled_from(["hook:tok", "hookid:h1", "hookclaim:tok"]),
       method=st.sampled_from(sorted(METHODS)))
def test_any_stored_value_gets_a_json_answer_and_a_whole_transaction(rpc, value, key, method):
    for k in ("hook:tok", "hookid:h1", "hookclaim:tok"):
        rpc.ok("index", "index", "delete", k)
    put(rpc, key, value)
    status, body = answer(rpc, method)
    assert status in (200, 500), (status, body)
    if status == 500:
        assert body["error"]["name"] in ("SyntaxError", "TypeError", "Error"), body
        assert stored(rpc, key) == value  # nothing written


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
       key=st.sampled_from(["hook:tok", "hookid:h1"]))
def test_a_number_or_boolean_at_a_published_key_never_fails_delete(rpc, value, key):
    """The case a differential fuzz against upstream found (500 here, 200 there)."""
    rpc.ok("index", "index", "delete", key)
    put(rpc, key, value)
    assert answer(rpc, "deleteHookIndexes") == (200, None)
