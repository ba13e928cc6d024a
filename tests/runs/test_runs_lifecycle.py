"""Run and step lifecycles through ``applyEvent`` over the route (docs/protocol.md §5.6, §11.7)."""
from datetime import datetime, timedelta

import pytest

from cells.models import RunCellState
from cells.runs import RunCell

from .support import RunClient

pytestmark = pytest.mark.django_db


def test_it_creates_a_pending_run_with_its_context_and_input(run):
    outcome = run.ok("run_created", event_data={
        "deploymentId": "dep-1", "workflowName": "wf", "input": ["arg1", "arg2"],
        "executionContext": {"userId": "user-1"},
    })
    created = run.get_run()
    assert created == outcome["run"]
    assert created["status"] == "pending"
    assert created["runId"] == "wrun_test"
    assert (created["deploymentId"], created["workflowName"]) == ("dep-1", "wf")
    assert created["executionContext"] == {"userId": "user-1"}
    assert created["input"] == ["arg1", "arg2"]
    assert created["specVersion"] == 3
    for absent in ("output", "error", "startedAt", "completedAt", "expiredAt"):
        assert absent not in created
    assert isinstance(created["createdAt"], datetime) and created["createdAt"] == created["updatedAt"]
    event = outcome["event"]
    assert event["eventType"] == "run_created" and event["eventId"] == "wevt_z00000000000000000001"
    assert outcome["releasedHooks"] == []
    assert outcome["runCreated"] == {"workflowName": "wf", "createdAt": created["createdAt"]}


def test_it_leaves_out_an_absent_execution_context(run):
    assert "executionContext" not in run.create()["run"]


def test_it_starts_a_run(run):
    run.create()
    outcome = run.ok("run_started")
    assert outcome["run"]["status"] == "running"
    assert isinstance(outcome["run"]["startedAt"], datetime)
    assert [e["eventType"] for e in outcome["events"]] == ["run_created", "run_started"]
    assert "eventData" not in outcome["event"]
    assert "runCreated" not in outcome


def test_it_completes_a_run_straight_from_pending(run):
    run.create()
    outcome = run.ok("run_completed", event_data={"output": [{"result": 42}]})
    assert outcome["run"]["status"] == "completed"
    assert outcome["run"]["output"] == [{"result": 42}]
    assert isinstance(outcome["run"]["completedAt"], datetime)
    assert run.get_run() == outcome["run"]


def test_it_fails_a_run_keeping_message_and_code(run):
    run.create()
    outcome = run.ok("run_failed", event_data={"error": {"message": "Something went wrong", "code": "ERR_001"}})
    assert outcome["run"]["status"] == "failed"
    assert outcome["run"]["error"] == {"message": "Something went wrong", "code": "ERR_001"}
    assert isinstance(outcome["run"]["completedAt"], datetime)


def test_it_fails_a_run_with_a_string_error_and_an_error_code(run):
    run.create()
    outcome = run.ok("run_failed", event_data={"error": "plain string failure", "errorCode": "MAX_DELIVERIES_EXCEEDED"})
    assert outcome["run"]["error"] == {"message": "plain string failure", "code": "MAX_DELIVERIES_EXCEEDED"}


def test_it_lets_error_code_win_over_the_errors_own_code(run):
    run.create()
    outcome = run.ok("run_failed", event_data={
        "error": {"message": "bad", "stack": "st", "code": "E1", "extra": 1}, "errorCode": "USER_ERROR"})
    assert outcome["run"]["error"] == {"message": "bad", "stack": "st", "code": "USER_ERROR"}
    assert outcome["event"]["eventData"]["error"] == {"message": "bad", "stack": "st", "code": "E1", "extra": 1}


def test_it_cancels_a_run(run):
    run.create()
    outcome = run.ok("run_cancelled")
    assert outcome["run"]["status"] == "cancelled"
    assert isinstance(outcome["run"]["completedAt"], datetime)


def test_it_creates_a_pending_step(run):
    run.create()
    outcome = run.ok("step_created", "step-123", {"stepName": "test-step", "input": ["input1", "input2"]})
    step = run.get_step("step-123")
    assert step == outcome["step"]
    assert step["status"] == "pending" and step["attempt"] == 0
    assert (step["runId"], step["stepId"], step["stepName"]) == ("wrun_test", "step-123", "test-step")
    assert step["input"] == ["input1", "input2"]
    assert "output" not in step and "error" not in step
    assert isinstance(step["createdAt"], datetime) and isinstance(step["updatedAt"], datetime)
    assert step["specVersion"] == 3


def test_it_answers_null_for_a_missing_step_event_or_run(run):
    assert run.get_run() is None
    run.create()
    assert run.get_step("nope") is None
    assert run.get_event("wevt_nope") is None


def test_it_completes_a_step(run):
    run.create()
    run.step("s1")
    outcome = run.ok("step_completed", "s1", {"result": ["ok"]})
    assert outcome["step"]["status"] == "completed"
    assert outcome["step"]["output"] == ["ok"]
    assert isinstance(outcome["step"]["completedAt"], datetime)


def test_it_counts_attempts_across_retries(run):
    run.create()
    run.step("s1")
    started = run.ok("step_started", "s1")["step"]
    assert (started["status"], started["attempt"]) == ("running", 1)
    assert isinstance(started["startedAt"], datetime)
    retrying = run.ok("step_retrying", "s1", {"error": "retry error"})["step"]
    assert (retrying["status"], retrying["attempt"]) == ("pending", 1)
    assert retrying["error"] == {"message": "retry error"}
    again = run.ok("step_started", "s1")["step"]
    assert (again["status"], again["attempt"]) == ("running", 2)
    assert again["startedAt"] == started["startedAt"]  # first start only
    assert again["error"] == {"message": "retry error"}  # kept


def test_it_restarts_a_running_step(run):
    run.create()
    run.step("s1")
    run.ok("step_started", "s1")
    assert run.ok("step_started", "s1")["step"]["attempt"] == 2


def test_a_step_event_carries_the_event_members(run):
    run.create()
    run.step("s1")
    event = run.ok("step_started", "s1", {"attempt": 1, "stepName": "n", "ignored": True})["event"]
    assert event["runId"] == "wrun_test"
    assert event["eventId"].startswith("wevt_")
    assert event["eventType"] == "step_started" and event["correlationId"] == "s1"
    assert isinstance(event["createdAt"], datetime)
    assert event["eventData"] == {"attempt": 1, "stepName": "n"}
    assert run.get_event(event["eventId"]) == event


def test_it_fails_a_step_with_a_null_byte_in_the_error(run):
    run.create()
    run.step("s1")
    outcome = run.ok("step_failed", "s1", {"error": "Error with null byte \u0000 in message"})
    assert outcome["step"]["error"] == {"message": "Error with null byte \u0000 in message"}
    assert run.get_step("s1")["error"]["message"] == "Error with null byte \u0000 in message"
    assert run.get_event(outcome["event"]["eventId"])["eventData"]["error"] == "Error with null byte \u0000 in message"


def test_it_fails_a_step_with_a_string_error_and_a_stack(run):
    run.create()
    run.step("s1")
    step = run.ok("step_failed", "s1", {"error": "boom", "stack": "at somewhere"})["step"]
    assert step["error"] == {"message": "boom", "stack": "at somewhere"}
    assert step["status"] == "failed" and isinstance(step["completedAt"], datetime)


def test_it_fails_a_step_with_an_unknown_error_shape(run):
    run.create()
    run.step("s1")
    assert run.ok("step_failed", "s1", {})["step"]["error"] == {"message": "Unknown error"}


def test_it_refuses_a_duplicate_step_and_logs_it_once(run):
    run.create()
    run.step("s1")
    outcome = run.refused("ENTITY_CONFLICT", "step_created", "s1", {"stepName": "again"})
    assert outcome["message"] == 'Step "s1" already exists'
    assert len(run.list_steps()["data"]) == 1
    assert run.event_types().count("step_created") == 1


def test_it_replays_run_created_on_an_existing_run(run):
    first = run.create()["run"]
    outcome = run.ok("run_created", event_data={"deploymentId": "other", "workflowName": "x", "input": []})
    assert outcome == {"ok": True, "run": first, "releasedHooks": []}
    assert run.event_types() == ["run_created"]


def test_it_replays_run_started_on_a_running_run(run, frozen_clock):
    run.create()
    started = run.ok("run_started")["run"]
    frozen_clock.advance(5000)
    outcome = run.ok("run_started")
    assert outcome == {"ok": True, "run": started, "releasedHooks": []}
    assert run.event_types() == ["run_created", "run_started"]


def test_it_bootstraps_a_missing_run_from_run_started(rpc):
    run = RunClient(rpc, "wrun_bootstrap_test")
    outcome = run.ok("run_started", event_data={
        "deploymentId": "dep", "workflowName": "bootstrap-workflow", "input": ["boot-input"]})
    assert outcome["run"]["status"] == "running"
    assert outcome["run"]["input"] == ["boot-input"]
    assert outcome["runCreated"]["workflowName"] == "bootstrap-workflow"
    assert [e["eventType"] for e in outcome["events"]] == ["run_created", "run_started"]
    assert run.event_types() == ["run_created", "run_started"]
    created = run.list_events()["data"][0]
    assert created["eventData"] == {"deploymentId": "dep", "workflowName": "bootstrap-workflow", "input": ["boot-input"]}


def test_it_bootstraps_with_a_null_input(run):
    outcome = run.ok("run_started", event_data={"deploymentId": "d", "workflowName": "w", "input": None})
    assert "input" not in outcome["run"]
    assert outcome["events"][0]["eventData"]["input"] is None


def test_it_keeps_runs_apart(rpc):
    one, two = RunClient(rpc, "wrun_one"), RunClient(rpc, "wrun_two")
    one.create(["run1-data"])
    two.create(["run2-data"])
    assert one.get_run()["input"] == ["run1-data"]
    assert two.get_run()["input"] == ["run2-data"]
    one.step("s")
    assert two.list_steps()["data"] == []
    assert two.event_ids() == ["wevt_z00000000000000000001"]


def test_it_continues_the_event_sequence_in_a_fresh_cell_instance(run):
    run.create()
    # every call builds a new RunCell; the counter lives in the database
    outcome = RunCell("wrun_test").apply_event({"runId": "wrun_test", "data": {"eventType": "run_started"}})
    assert outcome["event"]["eventId"] == "wevt_z00000000000000000002"
    assert run.event_types() == ["run_created", "run_started"]
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 2


def test_it_serves_many_reads_and_step_creations(run):
    run.create()
    run.ok("run_started")
    for i in range(50):
        run.step(f"s{i:02d}")
    assert all(run.get_run()["runId"] == "wrun_test" for _ in range(20))
    assert len(run.event_ids()) == 52
    assert run.event_ids() == [f"wevt_z{n:020d}" for n in range(1, 53)]


def test_it_records_the_creation_time_in_milliseconds(run, frozen_clock):
    created = run.create()["run"]
    assert created["createdAt"] == frozen_clock.now
    frozen_clock.advance(1234)
    assert run.ok("run_started")["run"]["startedAt"] == frozen_clock.now
    assert created["createdAt"] + timedelta(milliseconds=1234) == run.get_run()["updatedAt"]


def test_a_replayed_bootstrap_is_idempotent(run):
    data = {"deploymentId": "d", "workflowName": "w", "input": ["i"]}
    first = run.ok("run_started", event_data=data)
    replay = run.ok("run_started", event_data=data)
    assert replay == {"ok": True, "run": first["run"], "releasedHooks": []}
    assert run.event_types() == ["run_created", "run_started"]


def test_get_step_without_an_argument_looks_up_step_undefined(run):
    run.create()
    assert run.call("getStep") is None
    run.step("undefined")
    assert run.call("getStep")["stepId"] == "undefined"
    assert run.call("getEvent") is None


def test_extra_arguments_are_ignored(run):
    run.create()
    assert run.call("getRun", 1, 2, 3)["runId"] == "wrun_test"
    assert len(run.call("listEvents", {"limit": 1}, "extra")["data"]) == 1


@pytest.mark.parametrize("method", ["claimInflight", "releaseInflight", "alarm", "fetch"])
def test_the_dedup_claim_methods_stay_unroutable(rpc, method):
    status, body = rpc("runs", "claim:q:k", method, {"messageId": "m", "staleMs": 1})
    assert (status, body["error"]["message"]) == (404, f"unknown method: runs.{method}")


def _nulls(value, path="$"):
    if value is None:
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _nulls(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nulls(v, f"{path}[{i}]")


def test_no_answer_carries_null_for_an_absent_member(run):
    answers = [run.create(), run.ok("run_started"), run.step("s1"), run.ok("step_started", "s1"),
               run.ok("step_retrying", "s1", {"error": {"message": "m"}}), run.ok("step_started", "s1"),
               run.ok("step_failed", "s1", {"error": "e"}), run.hook("h1", "t1"),
               run.ok("hook_disposed", "h1"), run.ok("wait_created", "w", {"resumeAt": 1}),
               run.refused("STEP_NOT_FOUND", "step_started", "nope"),
               run.ok("run_failed", event_data={"error": "boom"}),
               run.get_run(), run.get_step("s1")]
    for page in (run.list_events(), run.list_steps(), run.list_hooks()):
        answers.append({k: v for k, v in page.items() if k != "cursor"})  # cursor null is the protocol
    for answer in answers:
        assert list(_nulls(answer)) == [], answer
