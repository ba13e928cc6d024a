"""The console's run actions as services (cells/operator_actions.py): what each writes, through the real machines.

docs/operations.md "Console actions"; the SDK's start() / wakeUpRun / reenqueueRun for the shapes.
"""
from __future__ import annotations

import json
import threading

import pytest

from cells import lifecycle, operator_actions as actions
from cells.index import IndexCell
from cells.models import Event, Run, RunLink
from cells.models.tombstone import FlowMessageRecord, RunRepair
from queueing.models import Message
from tests.conftest import is_postgres
from worldcell import codec

from .actions_support import INPUT, TARGET, client_run

pytestmark = pytest.mark.django_db


def events(run_id: str) -> list[tuple[str, str | None]]:
    return list(Event.objects.filter(run__cell__name=run_id).order_by("event_id").values_list("event_type",
                                                                                                "correlation_id"))


def body(msg: Message) -> dict:
    return codec.decode(msg.body_text)


def test_rerun_sends_what_start_sends_to_the_original_target(rpc, frozen_clock):
    client_run(rpc, "wrun_old", status="failed")
    result = actions.rerun_run("wrun_old", request_key="k1", user="ops")
    assert result.ok, result
    new = result.new_run_id
    assert new.startswith("wrun_") and len(new) == 31 and new != "wrun_old"

    run = Run.objects.select_related("cell").get(cell__name=new)
    assert (run.status, run.workflow_name, run.deployment_id, run.spec_version) == ("pending", "wf-order", "dpl_7", 3)
    assert codec.decode(run.input) == INPUT
    context = codec.decode(run.execution_context)
    assert context == {"traceCarrier": {}, "workflowCoreVersion": "4.6.0", "features": {"encryption": False}}
    assert events(new) == [("run_created", None)]
    created = codec.decode(Event.objects.get(run=run).body)
    assert created["specVersion"] == 3 and set(created["eventData"]) == {
        "deploymentId", "workflowName", "input", "executionContext"}

    msg = Message.objects.get(run_id=new)
    assert (msg.queue_name, msg.pathname, msg.target_base_url, msg.idempotency_key) == (
        "__wkf_workflow_wf-order", "flow", TARGET, None)
    assert msg.message_id == result.message_id and msg.cell.name == result.queue_cell == "q:0"
    assert body(msg) == {"runId": new, "traceCarrier": {}, "runInput": {
        "input": INPUT, "deploymentId": "dpl_7", "workflowName": "wf-order", "specVersion": 3,
        "executionContext": context}}
    # the new run's workflow message is recorded (it can be repaired / re-run in turn)
    assert FlowMessageRecord.objects.get(run_id=new).target_base_url == TARGET
    # the client's run index keys
    assert json.loads(IndexCell("index").get(f"runall:1767323045678:{new}"))["status"] == "pending"
    link = RunLink.objects.get()
    assert (link.run_id, link.source_run_id, link.kind, link.created_by) == (new, "wrun_old", "rerun", "ops")

    again = actions.rerun_run("wrun_old", request_key="k1")  # the same confirmation, submitted twice
    assert again.outcome == "skipped" and again.new_run_id == new and "already re-run by this request" in again.message
    assert Run.objects.count() == 2 and Message.objects.count() == 1


def test_rerun_skips_what_cannot_be_re_run_and_writes_nothing(rpc, frozen_clock):
    client_run(rpc, "wrun_active")
    client_run(rpc, "wrun_secret", status="completed",
               executionContext={"features": {"encryption": True}})
    client_run(rpc, "wrun_unknown", status="failed")
    FlowMessageRecord.objects.filter(run_id="wrun_unknown").delete()
    reasons = {r: actions.rerun_run(r, request_key="k").message
               for r in ("wrun_active", "wrun_secret", "wrun_unknown", "wrun_nope")}
    assert reasons == {
        "wrun_active": "still running: a run is re-run once it has finished (cancel it first)",
        "wrun_secret": "its input is encrypted with the original run's key: re-run it from the app",
        "wrun_unknown": "no workflow message was ever recorded for it, so its app's target URL is unknown",
        "wrun_nope": "the run does not exist (or it expired)",
    }
    assert Run.objects.count() == 3 and not Message.objects.exists() and not RunLink.objects.exists()


def test_a_refused_enqueue_rolls_the_new_run_back(rpc, frozen_clock):
    client_run(rpc, "wrun_old", status="failed")
    FlowMessageRecord.objects.filter(run_id="wrun_old").update(queue_shards=4)  # q:* is pinned to 1 shard
    from queueing.models import QueueCell

    for n in range(4):
        QueueCell.objects.get_or_create(name=f"q:{n}", defaults={"queue_shards": 1})
    QueueCell.objects.update(queue_shards=1)
    result = actions.rerun_run("wrun_old", request_key="k")
    assert result.outcome == "failed" and "CONFIG_MISMATCH" in result.message
    assert Run.objects.count() == 1 and not RunLink.objects.exists() and not Message.objects.exists()


def test_wake_completes_each_open_sleep_then_enqueues_once(rpc, frozen_clock):
    client_run(rpc, "wrun_sleep", waits=(("wait_1", "2026-01-09T00:00:00.000Z"), ("wait_2", "2026-02-01T00:00:00.000Z")))
    rpc.ok("runs", "wrun_sleep", "applyEvent", {"runId": "wrun_sleep", "data": {
        "eventType": "wait_completed", "correlationId": "wait_1"}})  # wait_1 is over already
    result = actions.wake_run("wrun_sleep")
    assert result.ok and result.completed_waits == ["wait_2"], result
    assert events("wrun_sleep")[-2:] == [("wait_completed", "wait_1"), ("wait_completed", "wait_2")]
    last = codec.decode(Event.objects.filter(run__cell__name="wrun_sleep").order_by("-event_id").first().body)
    assert last["eventData"] == {"resumeAt": codec.decode('{"__type":"Date","iso":"2026-02-01T00:00:00.000Z"}')}
    assert last["specVersion"] == 3
    msg = Message.objects.get(run_id="wrun_sleep")
    assert (msg.queue_name, msg.target_base_url, msg.message_id) == ("__wkf_workflow_wf-order", TARGET, result.message_id)
    assert body(msg) == {"runId": "wrun_sleep", "traceCarrier": {"tp": "00-abc"}}  # the recorded message
    assert msg.idempotency_key.startswith("repair:wrun_sleep:")

    again = actions.wake_run("wrun_sleep")
    assert again.outcome == "skipped" and "no pending sleep" in again.message
    assert Message.objects.filter(run_id="wrun_sleep").count() == 1


def test_wake_and_reenqueue_skip_finished_runs(rpc, frozen_clock):
    client_run(rpc, "wrun_done", status="completed", waits=(("wait_1", "2026-02-01T00:00:00.000Z"),))
    assert actions.wake_run("wrun_done").message == "the run is completed: nothing to wake"
    assert actions.reenqueue_run("wrun_done").message == "the run is completed: its workflow would do nothing"
    assert not Message.objects.exists() and events("wrun_done")[-1] == ("run_completed", None)


def test_reenqueue_sends_the_recorded_message_once_per_state(rpc, frozen_clock):
    client_run(rpc, "wrun_stuck")
    first = actions.reenqueue_run("wrun_stuck")
    assert first.ok, first
    msg = Message.objects.get(run_id="wrun_stuck")
    assert msg.message_id == first.message_id and body(msg) == {"runId": "wrun_stuck", "traceCarrier": {"tp": "00-abc"}}
    Message.objects.all().delete()  # delivered (acked) meanwhile
    second = actions.reenqueue_run("wrun_stuck")
    assert second.outcome == "skipped"
    assert second.message.startswith("already re-enqueued in this state") and first.message_id in second.message
    assert not Message.objects.exists() and RunRepair.objects.count() == 1


def test_bulk_reports_each_run(rpc, frozen_clock):
    client_run(rpc, "wrun_a", status="failed")
    client_run(rpc, "wrun_b")
    results = actions.run_many(lambda r: actions.rerun_run(r, request_key="bulk"), ["wrun_a", "wrun_b", "wrun_zz"])
    assert [r.outcome for r in results] == ["ok", "skipped", "skipped"]
    assert RunLink.objects.get().source_run_id == "wrun_a"


def test_the_link_survives_the_originals_retention(rpc, frozen_clock):
    client_run(rpc, "wrun_old", status="failed")
    new = actions.rerun_run("wrun_old", request_key="k").new_run_id
    assert lifecycle.expire_run("wrun_old", reason="manual")
    lifecycle.clean_run("wrun_old")
    assert not Run.objects.filter(cell__name="wrun_old").exists()
    assert RunLink.objects.get(run_id=new).source_run_id == "wrun_old"


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_reenqueues_send_one_message(rpc, frozen_clock):
    assert is_postgres()
    from django.db import connection

    client_run(rpc, "wrun_twice")
    barrier = threading.Barrier(2)
    results: list = []

    def click():
        try:
            barrier.wait(5)
            results.append(actions.reenqueue_run("wrun_twice"))
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(r.outcome for r in results) == ["ok", "skipped"]
    assert Message.objects.filter(run_id="wrun_twice").count() == 1
