"""Hook-token reservation, publication and owner-checked removal (docs/protocol.md §6.3; §11.5 items 34–35)."""
import json

import pytest

from worldcell import clock

pytestmark = pytest.mark.django_db

A = {"runId": "wrun_A", "hookId": "h1"}
B = {"runId": "wrun_B", "hookId": "h2"}


def hook_json(owner, token="tok"):
    return json.dumps({**owner, "token": token, "createdAt": "2026-01-02T03:04:05.678Z"})


def call(rpc, method, *args):
    return rpc("index", "index", method, *args)


def ok(rpc, method, *args):
    return rpc.ok("index", "index", method, *args)


def stored(rpc, key):
    return ok(rpc, "get", key)


@pytest.fixture
def frozen_clock():
    clock.set_clock(lambda: 1767323045678)
    yield 1767323045678
    clock.set_clock(None)


def test_it_runs_the_whole_reservation_story_of_the_acceptance_suite(rpc):
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": True}
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": True}
    assert ok(rpc, "reserveHookToken", "tok", B) == {"claimed": False, "holder": A}
    assert call(rpc, "finalizeHookIndexes", "tok", "h2", hook_json(B), B) == (
        500,
        {"error": {"name": "Error", "message": "Hook token tok is reserved by another hook"}},
    )
    assert ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A) is None
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": False, "holder": A}
    assert ok(rpc, "reserveHookToken", "tok", B) == {"claimed": False, "holder": A}
    assert call(rpc, "finalizeHookIndexes", "tok", "h2", hook_json(B), B) == (
        500,
        {"error": {"name": "Error", "message": "Hook token tok is owned by another hook"}},
    )
    assert ok(rpc, "deleteHookIndexes", "tok", "h1", B) is None
    assert stored(rpc, "hook:tok") == hook_json(A)
    assert stored(rpc, "hookid:h1") == hook_json(A)
    assert ok(rpc, "deleteHookIndexes", "tok", "h1", A) is None
    assert stored(rpc, "hook:tok") is None
    assert stored(rpc, "hookid:h1") is None


def test_it_stores_the_claim_object_with_the_reservation_time(rpc, frozen_clock):
    ok(rpc, "reserveHookToken", "tok", A)
    assert stored(rpc, "hookclaim:tok") == {"owner": A, "reservedAt": frozen_clock}


def test_it_refreshes_reserved_at_when_the_same_owner_reserves_again(rpc):
    clock.set_clock(lambda: 1000)
    try:
        ok(rpc, "reserveHookToken", "tok", A)
        clock.set_clock(lambda: 5000)
        ok(rpc, "reserveHookToken", "tok", A)
    finally:
        clock.set_clock(None)
    assert stored(rpc, "hookclaim:tok") == {"owner": A, "reservedAt": 5000}


def test_it_never_expires_a_claim(rpc):
    clock.set_clock(lambda: 0)
    try:
        ok(rpc, "reserveHookToken", "tok", A)
        clock.set_clock(lambda: 10**13)
        assert ok(rpc, "reserveHookToken", "tok", B) == {"claimed": False, "holder": A}
    finally:
        clock.set_clock(None)


def test_it_echoes_the_claim_owner_as_it_was_given(rpc):
    owner = {**A, "extra": [1, 2]}
    ok(rpc, "reserveHookToken", "tok", owner)
    assert ok(rpc, "reserveHookToken", "tok", B) == {"claimed": False, "holder": owner}
    # extra members do not change who the owner is
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": True}


def test_it_compares_both_members_of_the_owner(rpc):
    ok(rpc, "reserveHookToken", "tok", A)
    same_run = {"runId": "wrun_A", "hookId": "other"}
    same_hook = {"runId": "other", "hookId": "h1"}
    assert ok(rpc, "reserveHookToken", "tok", same_run) == {"claimed": False, "holder": A}
    assert ok(rpc, "reserveHookToken", "tok", same_hook) == {"claimed": False, "holder": A}


def test_it_publishes_hook_and_hookid_and_drops_the_claim_on_finalize(rpc):
    ok(rpc, "reserveHookToken", "tok", A)
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    assert stored(rpc, "hook:tok") == hook_json(A)
    assert stored(rpc, "hookid:h1") == hook_json(A)
    assert stored(rpc, "hookclaim:tok") is None
    keys = [k["name"] for k in ok(rpc, "list", {"prefix": "hook"})["keys"]]
    assert keys == ["hook:tok", "hookid:h1"]


def test_it_finalizes_without_a_prior_claim_and_idempotently(rpc):
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    assert stored(rpc, "hook:tok") == hook_json(A)


def test_it_overwrites_a_global_hookid_on_a_second_finalize_by_another_owner(rpc):
    ok(rpc, "finalizeHookIndexes", "t1", "h", hook_json({"runId": "wrun_1", "hookId": "h"}, "t1"), {"runId": "wrun_1", "hookId": "h"})
    later = hook_json({"runId": "wrun_2", "hookId": "h"}, "t2")
    ok(rpc, "finalizeHookIndexes", "t2", "h", later, {"runId": "wrun_2", "hookId": "h"})
    assert stored(rpc, "hookid:h") == later


def test_it_releases_only_the_callers_own_claim(rpc):
    ok(rpc, "reserveHookToken", "tok", A)
    assert ok(rpc, "releaseHookToken", "tok", B) is None
    assert stored(rpc, "hookclaim:tok")["owner"] == A
    ok(rpc, "releaseHookToken", "tok", A)
    assert stored(rpc, "hookclaim:tok") is None
    assert ok(rpc, "reserveHookToken", "tok", B) == {"claimed": True}


def test_it_never_releases_a_published_token(rpc):
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    ok(rpc, "releaseHookToken", "tok", A)
    assert stored(rpc, "hook:tok") == hook_json(A)
    assert stored(rpc, "hookid:h1") == hook_json(A)


def test_it_releases_an_unknown_token_without_error(rpc):
    assert ok(rpc, "releaseHookToken", "nope", A) is None


def test_it_deletes_each_hook_entry_only_for_its_owner(rpc):
    # hook:tok belongs to A, hookid:h1 was overwritten by B, a stale claim of A remains elsewhere
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    ok(rpc, "put", "hookid:h1", hook_json({"runId": "wrun_B", "hookId": "h1"}))
    ok(rpc, "deleteHookIndexes", "tok", "h1", A)
    assert stored(rpc, "hook:tok") is None
    assert stored(rpc, "hookid:h1") == hook_json({"runId": "wrun_B", "hookId": "h1"})


def test_it_deletes_the_callers_claim_in_delete_hook_indexes(rpc):
    ok(rpc, "reserveHookToken", "tok", A)
    ok(rpc, "deleteHookIndexes", "tok", "h1", B)
    assert stored(rpc, "hookclaim:tok")["owner"] == A
    ok(rpc, "deleteHookIndexes", "tok", "h1", A)
    assert stored(rpc, "hookclaim:tok") is None


def test_it_repairs_a_failed_publication_by_the_same_owner(rpc):
    # §6.3 crash repair: reserve succeeded, finalize never ran; the replay reserves again and publishes.
    ok(rpc, "reserveHookToken", "tok", A)
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": True}
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    assert stored(rpc, "hook:tok") == hook_json(A)
    assert stored(rpc, "hookid:h1") == hook_json(A)


def test_it_reads_the_holder_from_the_published_hook_json(rpc):
    ok(rpc, "put", "hook:tok", json.dumps({"runId": "wrun_X", "hookId": "hx", "token": "tok", "metadata": {"a": 1}}))
    assert ok(rpc, "reserveHookToken", "tok", A) == {"claimed": False, "holder": {"runId": "wrun_X", "hookId": "hx"}}


@pytest.mark.parametrize("method,args", [
    ("reserveHookToken", ["tok", A]),
    ("finalizeHookIndexes", ["tok", "h1", "{}", A]),
    ("deleteHookIndexes", ["tok", "h1", A]),
])
def test_it_fails_with_syntax_error_on_a_non_json_hook_value(rpc, method, args):
    ok(rpc, "put", "hook:tok", "not json")
    status, body = call(rpc, method, *args)
    assert status == 500
    assert body["error"]["name"] == "SyntaxError"
    assert stored(rpc, "hook:tok") == "not json"


def test_it_fails_with_syntax_error_on_a_non_json_hookid_value_in_delete(rpc):
    ok(rpc, "put", "hookid:h1", "{broken")
    status, body = call(rpc, "deleteHookIndexes", "tok", "h1", A)
    assert (status, body["error"]["name"]) == (500, "SyntaxError")


def test_it_rolls_back_delete_hook_indexes_when_it_fails_midway(rpc):
    ok(rpc, "finalizeHookIndexes", "tok", "h1", hook_json(A), A)
    ok(rpc, "put", "hookid:h1", "{broken")
    assert call(rpc, "deleteHookIndexes", "tok", "h1", A)[0] == 500
    assert stored(rpc, "hook:tok") == hook_json(A)


def test_it_keeps_a_hook_token_cell_apart_from_the_global_index(rpc):
    ok(rpc, "reserveHookToken", "tok", A)
    assert rpc.ok("index", "other", "reserveHookToken", "tok", B) == {"claimed": True}


@pytest.mark.parametrize(
    "method,args,field",
    [
        ("reserveHookToken", [], "token"),
        ("reserveHookToken", [5, A], "token"),
        ("reserveHookToken", ["tok"], "owner"),
        ("reserveHookToken", ["tok", None], "owner"),
        ("reserveHookToken", ["tok", {"runId": "r"}], "owner.hookId"),
        ("reserveHookToken", ["tok", {"runId": 1, "hookId": "h"}], "owner.runId"),
        ("finalizeHookIndexes", ["tok", None, "{}", A], "hookId"),
        ("finalizeHookIndexes", ["tok", "h1", {"runId": "wrun_A"}, A], "serializedHook"),
        ("finalizeHookIndexes", ["tok", "h1", "{}"], "owner"),
        ("releaseHookToken", ["tok", "wrun_A"], "owner"),
        ("deleteHookIndexes", ["tok", 7, A], "hookId"),
        ("deleteHookIndexes", ["t\u0000k", "h1", A], "token"),
    ],
)
def test_it_rejects_mistyped_hook_arguments_with_400(rpc, method, args, field):
    status, body = call(rpc, method, *args)
    assert status == 400
    assert body["error"]["name"] == "ValidationError"
    assert body["error"]["message"].startswith(field + ":")
    assert ok(rpc, "list", None) == {"keys": [], "list_complete": True}
