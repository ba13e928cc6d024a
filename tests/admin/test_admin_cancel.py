""""Cancel run" in the operator console: a real ``run_cancelled`` event, then the client's index work.

docs/protocol.md §5.6 (run_cancelled releases every hook), §6.1 (run index keys),
§6.3 (released hooks lose their index entries).
"""
from __future__ import annotations

import json

import pytest
from django.contrib.admin.models import LogEntry

from cells.index import IndexCell
from cells.models import Event, Hook, IndexEntry, Run

from .support import RUNS, ClientSequence

pytestmark = pytest.mark.django_db

CREATED_MS13 = "1767323045678"  # the frozen clock's start


@pytest.fixture
def seq(rpc, frozen_clock):
    return ClientSequence(rpc)


@pytest.fixture
def running_run_with_hooks(seq):
    """``wrun_live``: running, two published hooks (``tok-a``, ``tok-b``) and a step."""
    seq.create_run("wrun_live", workflow="wf-approve")
    seq.start_run("wrun_live")
    seq.apply("wrun_live", "hook_created", "hook_a", token="tok-a")
    seq.apply("wrun_live", "hook_created", "hook_b", token="tok-b", isWebhook=True)
    seq.apply("wrun_live", "step_created", "step_1", stepName="wait")
    index = IndexCell("index")
    assert index.get("hook:tok-a") is not None and index.get("hookid:hook_b") is not None
    return Run.objects.get(cell__name="wrun_live")


def index_meta(key: str) -> dict:
    return json.loads(IndexCell("index").get(key))


def test_it_cancels_a_run_with_a_real_event_and_removes_its_hook_indexes(admin_client, running_run_with_hooks):
    run = running_run_with_hooks
    assert index_meta(f"runall:{CREATED_MS13}:wrun_live")["status"] == "running"

    confirm = admin_client.get(f"{RUNS}{run.pk}/cancel/")
    assert confirm.status_code == 200 and b"Yes, cancel this run" in confirm.content
    assert Run.objects.get(pk=run.pk).status == "running"  # GET changes nothing

    response = admin_client.post(f"{RUNS}{run.pk}/cancel/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert b"Cancelled 1 run (2 hooks released and un-indexed)." in response.content

    run.refresh_from_db()
    assert run.status == "cancelled" and run.completed_at is not None
    last = Event.objects.filter(run=run).order_by("-event_id").first()
    assert last.event_type == "run_cancelled" and last.event_id == "wevt_z00000000000000000006"
    assert Run.objects.select_related("cell").get(pk=run.pk).cell.event_sequence == 6
    assert not Hook.objects.filter(run=run).exists()

    index = IndexCell("index")
    for key in ("hook:tok-a", "hookid:hook_a", "hook:tok-b", "hookid:hook_b"):
        assert index.get(key) is None, key
    assert index_meta(f"runall:{CREATED_MS13}:wrun_live") == {
        "runId": "wrun_live", "createdAt": "2026-01-02T03:04:05.678Z", "status": "cancelled",
    }
    assert index_meta(f"run:wf-approve:{CREATED_MS13}:wrun_live")["status"] == "cancelled"

    entry = LogEntry.objects.get()
    assert entry.object_id == str(run.pk) and entry.is_change() and entry.object_repr == "run wrun_live"
    assert entry.get_admin_url() == f"{RUNS}{run.pk}/change/"
    assert "wevt_z00000000000000000006" in entry.change_message and "hook_a, hook_b" in entry.change_message


def test_it_lets_a_released_token_be_reserved_by_another_run_after_the_cancel(admin_client, seq, running_run_with_hooks):
    admin_client.post(f"{RUNS}{running_run_with_hooks.pk}/cancel/", {"post": "yes"})
    seq.create_run("wrun_next")
    outcome = seq.apply("wrun_next", "hook_created", "hook_new", token="tok-a")
    assert outcome["hook"]["token"] == "tok-a"  # not a hook_conflict
    assert json.loads(IndexCell("index").get("hook:tok-a"))["runId"] == "wrun_next"


def test_it_cancels_selected_runs_from_the_list_after_a_confirmation_page(admin_client, seq):
    for run_id in ("wrun_1", "wrun_2"):
        seq.create_run(run_id)
    pks = [str(pk) for pk in Run.objects.values_list("pk", flat=True)]
    data = {"action": "cancel_selected_runs", "_selected_action": pks}
    confirm = admin_client.post(RUNS, data)
    assert confirm.status_code == 200 and b"Yes, cancel these 2 runs" in confirm.content
    assert set(Run.objects.values_list("status", flat=True)) == {"pending"}

    response = admin_client.post(RUNS, {**data, "post": "yes"}, follow=True)
    assert b"Cancelled 2 runs" in response.content
    assert set(Run.objects.values_list("status", flat=True)) == {"cancelled"}
    assert LogEntry.objects.count() == 2


def test_it_reports_the_runs_it_could_not_cancel_and_why(admin_client, seq):
    seq.create_run("wrun_done")
    seq.start_run("wrun_done")
    seq.apply("wrun_done", "run_completed", output="ok")
    seq.create_run("wrun_gone")
    seq.apply("wrun_gone", "run_cancelled")
    seq.create_run("wrun_todo")
    pks = [str(pk) for pk in Run.objects.values_list("pk", flat=True)]
    response = admin_client.post(
        RUNS, {"action": "cancel_selected_runs", "_selected_action": pks, "post": "yes"}, follow=True
    )
    html = response.content.decode()
    assert "Cancelled 1 run " in html
    assert "Could not cancel 2 runs" in html
    assert "wrun_done: ENTITY_CONFLICT: Cannot transition run from terminal state &quot;completed&quot;" in html
    assert "wrun_gone: already cancelled; nothing to do" in html
    assert Run.objects.get(cell__name="wrun_done").status == "completed"
    # the already-cancelled run got no second run_cancelled event
    assert Event.objects.filter(run__cell__name="wrun_gone", event_type="run_cancelled").count() == 1
    messages = sorted(LogEntry.objects.values_list("change_message", flat=True))
    assert len(messages) == 3 and sum(m.startswith("Cancel refused") for m in messages) == 2


def test_it_refuses_to_cancel_more_than_the_cap_in_one_request(admin_client, seq, monkeypatch):
    import cells.admin

    monkeypatch.setattr(cells.admin, "CANCEL_MAX_RUNS", 1)
    seq.create_run("wrun_x")
    seq.create_run("wrun_y")
    response = admin_client.post(
        RUNS, {"action": "cancel_selected_runs", "select_across": "1", "_selected_action": ["0"], "post": "yes"},
        follow=True,
    )
    assert b"Refused: more than 1 runs selected" in response.content
    assert set(Run.objects.values_list("status", flat=True)) == {"pending"}


def test_it_offers_the_cancel_button_only_for_runs_that_can_still_be_cancelled(admin_client, seq):
    seq.create_run("wrun_open")
    seq.create_run("wrun_closed")
    seq.apply("wrun_closed", "run_cancelled")
    open_pk = Run.objects.get(cell__name="wrun_open").pk
    closed_pk = Run.objects.get(cell__name="wrun_closed").pk
    assert b"Cancel run\xe2\x80\xa6" in admin_client.get(f"{RUNS}{open_pk}/change/").content
    assert b"Cancel run\xe2\x80\xa6" not in admin_client.get(f"{RUNS}{closed_pk}/change/").content


def test_it_rewrites_only_this_runs_index_keys(admin_client, seq):
    seq.create_run("wrun_keep", workflow="wf")
    seq.create_run("wrun_stop", workflow="wf")
    before = dict(IndexEntry.objects.filter(key__contains="wrun_keep").values_list("key", "value"))
    admin_client.post(f"{RUNS}{Run.objects.get(cell__name='wrun_stop').pk}/cancel/", {"post": "yes"})
    assert dict(IndexEntry.objects.filter(key__contains="wrun_keep").values_list("key", "value")) == before
