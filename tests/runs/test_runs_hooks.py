"""Hooks in the run cell: creation, conflicts, orphan repair, disposal, release (docs/protocol.md §5.6, §11.7–11.9)."""
from datetime import datetime

import pytest

from cells.models import HookMarker

from .support import RunClient

pytestmark = pytest.mark.django_db


def test_it_creates_a_hook_and_asks_the_client_to_index_it(run):
    run.create()
    outcome = run.ok("hook_created", "h1", {"token": "tok", "metadata": {"kind": "test"}})
    hook = outcome["hook"]
    assert hook == {
        "runId": "wrun_test", "hookId": "h1", "token": "tok", "ownerId": "", "projectId": "",
        "environment": "", "metadata": {"kind": "test"}, "createdAt": hook["createdAt"],
        "specVersion": 3, "isWebhook": False,
    }
    assert isinstance(hook["createdAt"], datetime)
    assert outcome["hookToIndex"] == hook
    assert outcome["event"]["eventType"] == "hook_created"
    assert run.list_hooks()["data"] == [hook]
    marker = HookMarker.objects.get(hook_id="h1")
    assert marker.event_id == outcome["event"]["eventId"]


def test_it_lists_two_hooks_of_a_run(run):
    run.create()
    run.hook("h1", "t1")
    run.hook("h2", "t2", isWebhook=True)
    hooks = run.list_hooks()["data"]
    assert [h["hookId"] for h in hooks] == ["h1", "h2"]
    assert hooks[1]["isWebhook"] is True


def test_it_refuses_an_exact_duplicate_hook(run):
    run.create()
    run.hook("h1", "tok")
    outcome = run.refused("ENTITY_CONFLICT", "hook_created", "h1", {"token": "tok"},
                          token_holder={"runId": "wrun_test", "hookId": "h1"})
    assert outcome["message"] == 'Hook "h1" already created'
    assert len(run.list_hooks()["data"]) == 1


def test_it_records_a_token_conflict_instead_of_creating_the_hook(rpc):
    first, second = RunClient(rpc, "wrun_first"), RunClient(rpc, "wrun_second")
    first.create()
    second.create()
    first.hook("h1", "shared-token")
    outcome = second.ok("hook_created", "h2", {"token": "shared-token"},
                        token_holder={"runId": "wrun_first", "hookId": "h1"})
    assert outcome["event"]["eventType"] == "hook_conflict"
    assert outcome["event"]["correlationId"] == "h2"
    assert outcome["event"]["eventData"] == {"token": "shared-token", "conflictingRunId": "wrun_first"}
    assert outcome["event"]["eventId"] == "wevt_z00000000000000000002"
    assert "hook" not in outcome and "hookToIndex" not in outcome
    assert outcome["releasedHooks"] == []
    assert second.list_hooks()["data"] == []
    assert len(first.list_hooks()["data"]) + len(second.list_hooks()["data"]) == 1
    # no marker either: the same hook id can still be created once the token is free
    second.hook("h2", "other-token")


def test_it_repairs_an_orphaned_hook_without_a_new_event(run):
    run.create()
    created = run.hook("h1", "tok")
    outcome = run.ok("hook_created", "h1", {"token": "tok"}, token_holder=None)
    assert outcome == {"ok": True, "hook": created["hook"], "hookToIndex": created["hook"], "releasedHooks": []}
    assert run.event_types() == ["run_created", "hook_created"]


def test_it_never_recreates_a_disposed_hook(run):
    run.create()
    run.hook("h1", "tok")
    disposed = run.ok("hook_disposed", "h1")
    assert disposed["releasedHooks"] == [{"hookId": "h1", "token": "tok"}]
    assert "hook" not in disposed
    assert run.list_hooks()["data"] == []
    outcome = run.refused("ENTITY_CONFLICT", "hook_created", "h1", {"token": "tok"})
    assert outcome["message"] == 'Hook "h1" already created'
    assert HookMarker.objects.filter(hook_id="h1").count() == 1


def test_it_refuses_to_dispose_an_unknown_hook(run):
    run.create()
    assert run.refused("HOOK_NOT_FOUND", "hook_disposed", "nope")["message"] == 'Hook "nope" not found'


def test_it_refuses_to_dispose_without_a_correlation_id(run):
    run.create()
    assert run.refused("HOOK_NOT_FOUND", "hook_disposed")["message"] == 'Hook "undefined" not found'


def test_it_receives_a_payload_for_a_live_hook(run):
    run.create()
    run.hook("h1", "tok")
    outcome = run.ok("hook_received", "h1", {"payload": b"\x00\x01", "token": "tok"})
    assert outcome == {"ok": True, "event": outcome["event"], "releasedHooks": []}
    assert outcome["event"]["eventData"] == {"payload": b"\x00\x01", "token": "tok"}


@pytest.mark.parametrize("finish,data", [
    ("run_completed", {"output": 1}), ("run_failed", {"error": "x"}), ("run_cancelled", None)])
def test_it_releases_every_hook_when_the_run_ends(run, finish, data):
    run.create()
    run.hook("zeta", "t-z")
    run.hook("alpha", "t-a")
    outcome = run.ok(finish, **({} if data is None else {"event_data": data}))
    assert outcome["releasedHooks"] == [{"hookId": "alpha", "token": "t-a"}, {"hookId": "zeta", "token": "t-z"}]
    assert run.list_hooks()["data"] == []
    assert HookMarker.objects.count() == 2
    run.refused("HOOK_NOT_FOUND", "hook_received", "zeta", {"payload": 1})


def test_a_client_sent_hook_conflict_is_appended(run):
    run.create()
    outcome = run.ok("hook_conflict", "h1", {"token": "t", "conflictingRunId": "wrun_x", "extra": 1})
    assert outcome["event"]["eventData"] == {"token": "t", "conflictingRunId": "wrun_x"}
    assert run.list_hooks()["data"] == []


def test_hooks_list_by_creation_time_not_by_id(run, frozen_clock):
    run.create()
    for hook_id in ("z-first-hook", "z-second-hook", "a-third-hook"):
        frozen_clock.advance(2)
        run.hook(hook_id, "tok-" + hook_id)
    assert [h["hookId"] for h in run.list_hooks()["data"]] == ["z-first-hook", "z-second-hook", "a-third-hook"]
    desc = run.list_hooks({"sortOrder": "desc"})["data"]
    assert [h["hookId"] for h in desc] == ["a-third-hook", "z-second-hook", "z-first-hook"]
