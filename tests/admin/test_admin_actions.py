"""The console's run actions and the edited-URL redrive, through Django's test client (cells/admin_actions.py,
queueing/admin_redrive_url.py; docs/operations.md "Console actions")."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry

from cells import lifecycle
from cells.models import Event, Run, RunLink
from queueing.models import DeadLetter, Message
from tests.queueing.support import Answer, HttpSink, tick

from .actions_support import TARGET, client_run, pk
from .support import RUNS
from .test_admin_queue import DEAD, Queue

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

ACTION_PERMS = ("cells.rerun_run", "cells.wake_run", "cells.reenqueue_run")


def new_run_id(response) -> str:
    return re.search(rb"(wrun_[0-9A-Z]{26})", response.content).group(1).decode()


def test_rerun_from_the_run_page_confirms_then_starts_a_linked_run(make_operator, rpc, frozen_clock):
    client_run(rpc, "wrun_old", status="failed")
    ops = make_operator("cells.rerun_run")
    page = ops.get(f"{RUNS}{pk('wrun_old')}/change/").content.decode()
    assert f"{RUNS}{pk('wrun_old')}/rerun/" in page and "Re-run…" in page
    assert "Wake up…" not in page and "Re-enqueue…" not in page  # not this user's, and the run is finished

    confirm = ops.get(f"{RUNS}{pk('wrun_old')}/rerun/")
    html = confirm.content.decode()
    assert confirm.status_code == 200 and "Yes, re-run this run" in html
    for fact in ("run_created", "__wkf_workflow_wf-order", TARGET, "dpl_7", "{runId, traceCarrier, runInput}"):
        assert fact in html, fact
    assert Run.objects.count() == 1  # GET changes nothing
    key = re.search(r'name="request_key" value="([0-9A-Z]{26})"', html).group(1)

    done = ops.post(f"{RUNS}{pk('wrun_old')}/rerun/", {"post": "yes", "request_key": key}, follow=True)
    new = RunLink.objects.get().run_id
    assert done.redirect_chain[-1][0] == f"{RUNS}{pk(new)}/change/"  # lands on the new run
    assert f"Run wrun_old: started {new}" in done.content.decode()
    assert re.search(rf'Re-run of <a href="/admin/cells/run/by-id/wrun_old/">wrun_old</a>', done.content.decode())
    old_page = ops.get(f"{RUNS}{pk('wrun_old')}/change/").content.decode()
    assert f'Re-run as\n    <a href="/admin/cells/run/by-id/{new}/">{new}</a>' in old_page
    assert Message.objects.get(run_id=new).target_base_url == TARGET

    twice = ops.post(f"{RUNS}{pk('wrun_old')}/rerun/", {"post": "yes", "request_key": key}, follow=True)
    assert b"already re-run by this request" in twice.content and Run.objects.count() == 2
    entries = list(LogEntry.objects.order_by("pk").values_list("object_id", "change_message"))
    assert entries[0] == (str(pk("wrun_old")), f"Re-run: ok: started {new} (workflow message "
                          f"{Message.objects.get(run_id=new).message_id} on q:0 to {TARGET})")
    assert entries[1][1].startswith("Re-run: skipped: already re-run by this request")


def test_a_tombstoned_original_leaves_the_new_runs_page_and_link_working(make_operator, rpc, frozen_clock):
    from cells.operator_actions import rerun_run

    client_run(rpc, "wrun_old", status="failed")
    new = rerun_run("wrun_old", request_key="K" * 26).new_run_id
    assert lifecycle.expire_run("wrun_old", reason="manual")
    lifecycle.clean_run("wrun_old")
    ops = make_operator()
    page = ops.get(f"{RUNS}{pk(new)}/change/")
    assert page.status_code == 200 and b'Re-run of <a href="/admin/cells/run/by-id/wrun_old/">wrun_old</a>' in page.content
    follow = ops.get("/admin/cells/run/by-id/wrun_old/", follow=True)
    assert follow.status_code == 200 and follow.redirect_chain[-1][0].startswith("/admin/cells/runtombstone/")


def test_wake_up_is_offered_for_open_sleeps_and_records_wait_completed(make_operator, rpc, frozen_clock):
    client_run(rpc, "wrun_nap", waits=(("wait_9", "2026-03-01T00:00:00.000Z"),))
    client_run(rpc, "wrun_busy")
    ops = make_operator("cells.wake_run")
    assert b"Wake up\xe2\x80\xa6" in ops.get(f"{RUNS}{pk('wrun_nap')}/change/").content
    assert b"Wake up\xe2\x80\xa6" not in ops.get(f"{RUNS}{pk('wrun_busy')}/change/").content  # nothing to wake
    confirm = ops.get(f"{RUNS}{pk('wrun_nap')}/wake/").content.decode()
    assert "wait_completed" in confirm and "<code>wait_9</code>" in confirm and "2026-03-01 00:00:00.000" in confirm
    ops.post(f"{RUNS}{pk('wrun_nap')}/wake/", {"post": "yes"})
    last = Event.objects.filter(run__cell__name="wrun_nap").order_by("-event_id").first()
    assert (last.event_type, last.correlation_id) == ("wait_completed", "wait_9")
    msg = Message.objects.get(run_id="wrun_nap")
    assert (msg.queue_name, msg.target_base_url) == ("__wkf_workflow_wf-order", TARGET)
    assert "Wake up: ok: completed 1 wait (wait_9)" in LogEntry.objects.get().change_message
    assert b"Wake up\xe2\x80\xa6" not in ops.get(f"{RUNS}{pk('wrun_nap')}/change/").content  # no open sleep left


def test_re_enqueue_twice_sends_one_message(make_operator, rpc, frozen_clock):
    client_run(rpc, "wrun_stuck")
    ops = make_operator("cells.reenqueue_run")
    confirm = ops.get(f"{RUNS}{pk('wrun_stuck')}/reenqueue/").content.decode()
    assert "repair:wrun_stuck:2" in confirm and "Yes, re-enqueue this run" in confirm
    first = ops.post(f"{RUNS}{pk('wrun_stuck')}/reenqueue/", {"post": "yes"}, follow=True)
    second = ops.post(f"{RUNS}{pk('wrun_stuck')}/reenqueue/", {"post": "yes"}, follow=True)
    assert b"workflow message msg_" in first.content
    assert b"already re-enqueued in this state (event 2)" in second.content
    assert Message.objects.filter(run_id="wrun_stuck").count() == 1
    assert [m.split(":")[1].strip() for m in LogEntry.objects.order_by("pk").values_list("change_message", flat=True)] == [
        "ok", "skipped"]


def test_a_view_only_operator_sees_no_action_and_gets_403(make_operator, rpc, frozen_clock, queue):
    client_run(rpc, "wrun_f", status="failed")
    client_run(rpc, "wrun_r", waits=(("wait_1", "2026-03-01T00:00:00.000Z"),))
    queue.dead_letter("msg_dead")
    viewer = make_operator()
    for run_id in ("wrun_f", "wrun_r"):
        page = viewer.get(f"{RUNS}{pk(run_id)}/change/").content.decode()
        for label in ("Re-run…", "Wake up…", "Re-enqueue…", "Cancel run…"):
            assert label not in page
        for kind in ("rerun", "wake", "reenqueue"):
            assert viewer.get(f"{RUNS}{pk(run_id)}/{kind}/").status_code == 403
            assert viewer.post(f"{RUNS}{pk(run_id)}/{kind}/", {"post": "yes", "request_key": "A" * 26}).status_code == 403
    listing = viewer.get(RUNS).content.decode()
    assert "rerun_selected_runs" not in listing and "cancel_selected_runs" not in listing
    dead = DeadLetter.objects.get()
    assert b"Redrive to another URL" not in viewer.get(f"{DEAD}{dead.pk}/change/").content
    assert viewer.get(f"{DEAD}{dead.pk}/redrive-url/").status_code == 403
    assert viewer.post(f"{DEAD}{dead.pk}/redrive-url/", {"target": "http://x.test", "post": "yes"}).status_code == 403
    # a refused bulk POST does nothing either
    viewer.post(RUNS, {"action": "rerun_selected_runs", "_selected_action": [pk("wrun_f")], "post": "yes",
                       "request_key": "A" * 26})
    assert Run.objects.count() == 2 and not LogEntry.objects.exists()
    assert DeadLetter.objects.filter(pk=dead.pk, target_base_url=dead.target_base_url).exists()


def test_bulk_rerun_of_the_filtered_list_confirms_the_count_and_reports_each_run(make_operator, rpc, frozen_clock):
    client_run(rpc, "wrun_f1", status="failed", workflow="wf-x")
    client_run(rpc, "wrun_f2", status="failed", workflow="wf-x")
    client_run(rpc, "wrun_other", status="failed", workflow="wf-y")
    client_run(rpc, "wrun_done", status="completed", workflow="wf-x")
    ops = make_operator("cells.rerun_run")
    url = f"{RUNS}?status__exact=failed&workflow_name=wf-x"
    assert "rerun_selected_runs" in ops.get(url).content.decode()
    data = {"action": "rerun_selected_runs", "select_across": "1", "index": "0", "_selected_action": [pk("wrun_f1")]}
    confirm = ops.post(url, data).content.decode()
    assert "2 runs selected" in confirm and "at most 500 per request" in confirm and "Yes, re-run these 2 runs" in confirm
    assert "wrun_other" not in confirm and "wrun_done" not in confirm
    assert "<code>status__exact=failed</code>" in confirm
    key = re.search(r'name="request_key" value="([0-9A-Z]{26})"', confirm).group(1)
    pks = re.findall(r'name="_selected_action" value="(\d+)"', confirm)
    assert sorted(map(int, pks)) == sorted([pk("wrun_f1"), pk("wrun_f2")])

    # meanwhile wrun_f2's workflow message record is lost: it is reported as skipped, with the reason
    from cells.models.tombstone import FlowMessageRecord

    FlowMessageRecord.objects.filter(run_id="wrun_f2").delete()
    result = ops.post(url, {"action": "rerun_selected_runs", "_selected_action": pks, "post": "yes", "request_key": key})
    html = result.content.decode()
    assert result.status_code == 200 and "1 ok · 1 skipped · 0 failed" in html
    assert re.search(r'wc-result-ok">\s*<td class="wc-mono"><a href="[^"]+">wrun_f1</a>', html)
    assert re.search(r'wc-result-skipped">\s*<td class="wc-mono"><a href="[^"]+">wrun_f2</a>', html)
    assert "its app&#x27;s target URL is unknown" in html
    new = RunLink.objects.get(source_run_id="wrun_f1").run_id
    assert f"open {new}" in html
    assert LogEntry.objects.count() == 2
    # submitted again: nothing new
    ops.post(url, {"action": "rerun_selected_runs", "_selected_action": pks, "post": "yes", "request_key": key})
    assert RunLink.objects.count() == 1


def test_bulk_refuses_more_than_the_cap(make_operator, rpc, frozen_clock, monkeypatch):
    import cells.admin_actions

    monkeypatch.setattr(cells.admin_actions, "BULK_MAX_RUNS", 1)
    client_run(rpc, "wrun_a", status="failed")
    client_run(rpc, "wrun_b", status="failed")
    ops = make_operator("cells.rerun_run")
    response = ops.post(RUNS, {"action": "rerun_selected_runs", "select_across": "1", "index": "0",
                               "_selected_action": [pk("wrun_a")]}, follow=True)
    assert b"Refused: more than 1 runs selected (at most 1 per request)" in response.content
    assert not RunLink.objects.exists()


def test_bulk_cancel_ends_on_the_result_page(make_operator, rpc, frozen_clock):
    client_run(rpc, "wrun_a")
    client_run(rpc, "wrun_b", status="completed")
    ops = make_operator("cells.cancel_run")
    data = {"action": "cancel_selected_runs", "_selected_action": [pk("wrun_a"), pk("wrun_b")]}
    assert b"2 runs selected" in ops.post(RUNS, data).content
    html = ops.post(RUNS, {**data, "post": "yes"}).content.decode()
    assert "1 ok · 1 skipped · 0 failed" in html and "Cannot transition run from terminal state" in html


@pytest.fixture
def queue(sink, vclock):
    return Queue(sink, vclock)


def test_redrive_to_an_edited_url_checks_it_shows_old_and_new_and_delivers_there(make_operator, queue, sink, vclock):
    queue.dead_letter("msg_moved")
    dead = DeadLetter.objects.get()
    old = dead.target_base_url
    ops = make_operator("queueing.redrive_edited_url")
    assert b"Redrive to another URL" in ops.get(f"{DEAD}{dead.pk}/change/").content
    form = ops.get(f"{DEAD}{dead.pk}/redrive-url/").content.decode()
    assert f'value="{old}"' in form

    for bad, why in (("ftp://x.test", "must start with http:// or https://"), ("/relative", "must start with http"),
                     ("http://", "must name a host"), ("http://a b.test", "spaces or control characters"),
                     ("https://x.test/?q=1", "no query or fragment"), (old, "its current target"),
                     ("https://ops:hunter2@x.test", "user name or password is not accepted")):
        page = ops.post(f"{DEAD}{dead.pk}/redrive-url/", {"target": bad, "post": "yes"}).content.decode()
        assert why in page, (bad, page[:200])
    assert DeadLetter.objects.filter(pk=dead.pk).exists() and not Message.objects.exists()

    other = HttpSink()
    try:
        confirm = ops.post(f"{DEAD}{dead.pk}/redrive-url/", {"target": f" {other.url} "}).content.decode()
        assert "Yes, redrive to the new URL" in confirm and old in confirm and other.url in confirm
        assert DeadLetter.objects.filter(pk=dead.pk).exists()  # not yet
        ops.post(f"{DEAD}{dead.pk}/redrive-url/", {"target": other.url, "post": "yes"})
        msg = Message.objects.get(message_id="msg_moved")
        assert (msg.target_base_url, msg.attempt) == (other.url, 0) and not DeadLetter.objects.exists()
        other.answer(Answer(200))
        before = sink.count()
        tick(vclock)
        assert other.count() == 1 and sink.count() == before
        assert other.requests[-1].message_id == "msg_moved"
    finally:
        other.close()
    entry = LogEntry.objects.get()
    assert old in entry.change_message and other.url in entry.change_message and "->" in entry.change_message
