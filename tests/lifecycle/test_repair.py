"""Stuck-run repair: which runs are stuck, at most one repair per stuck state, races (docs/lifecycle.md)."""
from __future__ import annotations

import threading

import pytest
from prometheus_client import REGISTRY
from django.core.management import call_command
from django.db import connection

from cells import repair
from cells.models import RunCellState
from cells.models.tombstone import FlowMessageRecord, RunRepair
from queueing.models import Message
from tests.conftest import is_postgres
from tests.lifecycle.support import TARGET, enqueue
from tests.runs.support import RunClient
from worldcell import codec
from worldcell_client import shared_codec_dumps

MIN = 60_000


@pytest.fixture
def stuck_after(settings):
    settings.WORLDCELL_STUCK_RUN_AFTER_MS = MIN
    return settings


def started_run(rpc, run_id: str) -> RunClient:
    """A running run whose workflow message was enqueued (and so recorded) and then purged."""
    run = RunClient(rpc, run_id)
    run.create()
    run.ok("run_started")
    enqueue(rpc, "__wkf_workflow_wf", {"runId": run_id, "traceCarrier": {"t": "1"}})
    purge(run_id)
    return run


def purge(run_id: str) -> None:
    """What an operator's purge (or a bad redrive, or a bug upstream) leaves: no message of the run."""
    Message.objects.filter(run_id=run_id).delete()


def sequence(run_id: str) -> int:
    return RunCellState.objects.get(name=run_id).event_sequence


pytestmark = pytest.mark.django_db


def test_a_purged_run_is_repaired_once_per_stuck_state(rpc, stuck_after, frozen_clock):
    run = started_run(rpc, "wrun_stuck")
    record = FlowMessageRecord.objects.get(run_id="wrun_stuck")
    assert (record.queue_name, record.pathname, record.target_base_url, record.queue_cell) == (
        "__wkf_workflow_wf", "flow", TARGET, "q:0")
    frozen_clock.advance(MIN - 1)
    assert repair.reconcile().repaired == []  # not idle long enough
    frozen_clock.advance(2)
    before = REGISTRY.get_sample_value("worldcell_stuck_run_repairs_total") or 0
    report = repair.reconcile()
    assert [s.run_id for s in report.stuck] == ["wrun_stuck"] and len(report.repaired) == 1
    assert REGISTRY.get_sample_value("worldcell_stuck_run_repairs_total") == before + 1  # the metric
    msg = Message.objects.get(run_id="wrun_stuck")
    assert msg.message_id == report.repaired[0] and msg.message_id.startswith("msg_") and len(msg.message_id) == 30
    assert msg.idempotency_key == f"repair:wrun_stuck:{sequence('wrun_stuck')}"
    assert (msg.queue_name, msg.pathname, msg.target_base_url, msg.due_at) == (
        "__wkf_workflow_wf", "flow", TARGET, frozen_clock.ms)
    assert msg.body_text == shared_codec_dumps({"runId": "wrun_stuck", "traceCarrier": {"t": "1"}})
    for _ in range(5):  # the repair message is pending: not stuck
        assert repair.reconcile().repaired == []
    purge("wrun_stuck")  # even if the repair message is lost too, the same state is not repaired again
    for _ in range(5):
        frozen_clock.advance(MIN)
        report = repair.reconcile()
        assert report.repaired == [] and [s.reason for s in report.stuck] == ["already repaired in this state"]
    assert RunRepair.objects.filter(run_id="wrun_stuck").count() == 1
    # a new event is a new state: stuck again later, repaired again (once)
    run.step("step_1")
    enqueue(rpc, "__wkf_workflow_wf", {"runId": "wrun_stuck"})
    purge("wrun_stuck")
    frozen_clock.advance(MIN + 1)
    assert len(repair.reconcile().repaired) == 1 and len(repair.reconcile().repaired) == 0
    assert sorted(RunRepair.objects.values_list("event_sequence", flat=True)) == [2, 3]
    assert Message.objects.get(run_id="wrun_stuck").idempotency_key == "repair:wrun_stuck:3"


def test_parked_runs_are_never_touched(rpc, stuck_after, frozen_clock):
    hooked = started_run(rpc, "wrun_hook")
    hooked.hook("hook_1", "tok-1")
    waiting = started_run(rpc, "wrun_wait")
    waiting.ok("wait_created", "wait_1", {"resumeAt": codec.from_epoch_ms(frozen_clock.ms + 60 * MIN)})
    done_wait = started_run(rpc, "wrun_waited")
    done_wait.ok("wait_created", "wait_1", {"resumeAt": codec.from_epoch_ms(frozen_clock.ms + 60 * MIN)})
    done_wait.ok("wait_completed", "wait_1")
    found = []
    for _ in range(5):
        frozen_clock.advance(10 * MIN)
        found.append([s.run_id for s in repair.reconcile().stuck])
    # only the run whose wait is over (nothing parks it) was stuck, once: then it had its repair message
    assert found == [["wrun_waited"], [], [], [], []]
    assert not Message.objects.filter(run_id__in=["wrun_hook", "wrun_wait"]).exists()
    assert Message.objects.filter(run_id="wrun_waited").count() == 1
    # once the wait is due and nothing was queued to resume it, the run is stuck
    frozen_clock.advance(11 * MIN)
    assert [s.run_id for s in repair.reconcile().stuck] == ["wrun_wait"]
    assert Message.objects.filter(run_id="wrun_wait").count() == 1
    assert not Message.objects.filter(run_id="wrun_hook").exists()


def test_terminal_runs_runs_with_messages_and_runs_without_a_record_are_not_repaired(rpc, stuck_after, frozen_clock):
    done = started_run(rpc, "wrun_done")
    done.ok("run_completed", event_data={"output": [1]})
    started_run(rpc, "wrun_queued")
    enqueue(rpc, "__wkf_step_wf", {"workflowRunId": "wrun_queued", "stepId": "s", "workflowName": "wf"}, delay=3600)
    norec = RunClient(rpc, "wrun_norecord")
    norec.create()
    frozen_clock.advance(2 * MIN)
    report = repair.reconcile()
    assert [(s.run_id, s.repairable, s.reason) for s in report.stuck] == [
        ("wrun_norecord", False, "no workflow message was ever recorded for it")]
    assert report.repaired == [] and not RunRepair.objects.exists()


def test_manage_reconcile_lists_and_repairs(rpc, stuck_after, frozen_clock, capsys):
    started_run(rpc, "wrun_cmd")
    frozen_clock.advance(2 * MIN)
    call_command("reconcile", "--dry-run")
    out = capsys.readouterr().out
    assert "wrun_cmd  running   stuck since" in out and "1 stuck run(s); would repair 1" in out
    assert not Message.objects.filter(run_id="wrun_cmd").exists()
    call_command("reconcile")
    assert "repaired 1" in capsys.readouterr().out
    assert Message.objects.filter(run_id="wrun_cmd").count() == 1
    assert repair.stuck_since("wrun_cmd") is None  # it has a message now


def test_repair_off(rpc, settings, frozen_clock):
    settings.WORLDCELL_STUCK_RUN_AFTER_MS = None
    started_run(rpc, "wrun_off")
    frozen_clock.advance(100 * MIN)
    assert repair.reconcile().stuck == []


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_run_that_completes_during_the_sweep_is_not_re_enqueued(rpc, stuck_after, frozen_clock, monkeypatch):
    assert is_postgres()
    started_run(rpc, "wrun_race")
    frozen_clock.advance(2 * MIN)
    stuck, _ = repair.find_stuck()
    assert [s.run_id for s in stuck] == ["wrun_race"]
    lock_taken = threading.Event()
    errors: list[BaseException] = []

    def complete_concurrently(found):
        # another connection completes the run while the sweep is about to lock it: it
        # takes the run cell lock first and holds it until its transaction commits
        def other():
            from django.db import transaction

            from cells.runs import RunCell
            try:
                with transaction.atomic():
                    with connection.cursor() as cur:
                        cur.execute('SELECT 1 FROM "cells_runcellstate" WHERE "name" = %s FOR UPDATE', ["wrun_race"])
                    lock_taken.set()
                    threading.Event().wait(0.3)  # the sweep now waits on the lock
                    outcome = RunCell("wrun_race").apply_event(
                        {"runId": "wrun_race", "data": {"eventType": "run_completed", "eventData": {"output": 1}}})
                    assert outcome["ok"], outcome
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                lock_taken.set()
            finally:
                connection.close()

        t = threading.Thread(target=other)
        t.start()
        lock_taken.wait(10)
        complete_concurrently.thread = t

    monkeypatch.setattr(repair, "_before_lock", complete_concurrently)
    assert repair.repair_run(stuck[0]) is None
    complete_concurrently.thread.join(10)
    assert errors == []
    assert RunClient(rpc, "wrun_race").get_run()["status"] == "completed"
    assert not Message.objects.filter(run_id="wrun_race").exists()
    assert not RunRepair.objects.exists()
