"""The index cell is keyed by tenant (docs/tenants.md): the same keys, prefixes and hook tokens in
two tenants are two different cells, through the RPC route with each tenant's own secret.

Run cells and queue shards are not keyed by tenant yet (docs/tenants.md "What is in place");
this file covers the index cell and its hook-token ownership.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

A = {"runId": "wrun_A", "hookId": "h1"}
B = {"runId": "wrun_B", "hookId": "h2"}


def hook_json(owner, token="tok"):
    return json.dumps({**owner, "token": token, "createdAt": "2026-01-02T03:04:05.678Z"})


def test_the_same_keys_in_two_tenants_are_two_entries(two_tenants):
    mine, theirs = two_tenants
    mine.ok("index", "index", "put", "run:wf:0001:wrun_1", "mine")
    assert theirs.ok("index", "index", "get", "run:wf:0001:wrun_1") is None
    assert theirs.ok("index", "index", "list", {"prefix": "run:"}) == {"keys": [], "list_complete": True}
    theirs.ok("index", "index", "put", "run:wf:0001:wrun_1", "theirs")
    theirs.ok("index", "index", "put", "run:wf:0002:wrun_2", "theirs too")
    assert mine.ok("index", "index", "get", "run:wf:0001:wrun_1") == "mine"
    assert theirs.ok("index", "index", "get", "run:wf:0001:wrun_1") == "theirs"
    assert mine.ok("index", "index", "list", {"prefix": "run:"})["keys"] == [{"name": "run:wf:0001:wrun_1"}]
    # a cursor names a key, not a position: the other tenant's keys beyond it stay invisible
    page = mine.ok("index", "index", "list", {"prefix": "run:", "cursor": "run:wf:0001:wrun_1"})
    assert page == {"keys": [], "list_complete": True}
    theirs.ok("index", "index", "delete", "run:wf:0001:wrun_1")
    assert mine.ok("index", "index", "get", "run:wf:0001:wrun_1") == "mine"
    assert theirs.ok("index", "index", "get", "run:wf:0001:wrun_1") is None


def test_a_hook_token_held_in_one_tenant_is_free_in_the_other(two_tenants):
    mine, theirs = two_tenants
    assert mine.ok("index", "index", "reserveHookToken", "tok", A) == {"claimed": True}
    assert mine.ok("index", "index", "finalizeHookIndexes", "tok", "h1", hook_json(A), A) is None
    # the other tenant learns nothing of the holder and can own the same token itself
    assert theirs.ok("index", "index", "reserveHookToken", "tok", B) == {"claimed": True}
    assert theirs.ok("index", "index", "finalizeHookIndexes", "tok", "h2", hook_json(B), B) is None
    assert mine.ok("index", "index", "reserveHookToken", "tok", B) == {"claimed": False, "holder": A}
    assert theirs.ok("index", "index", "get", "hook:tok") == hook_json(B)
    # removing it in one tenant leaves the other's ownership alone
    assert theirs.ok("index", "index", "deleteHookIndexes", "tok", "h2", B) is None
    assert theirs.ok("index", "index", "get", "hook:tok") is None
    assert mine.ok("index", "index", "get", "hook:tok") == hook_json(A)
    assert mine.ok("index", "index", "get", "hookid:h1") == hook_json(A)
    assert theirs.ok("index", "index", "releaseHookToken", "tok", A) is None
    assert mine.ok("index", "index", "reserveHookToken", "tok", B) == {"claimed": False, "holder": A}
