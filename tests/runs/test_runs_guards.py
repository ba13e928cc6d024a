"""Guard order and returned failures of ``applyEvent`` (docs/protocol.md §4.5, §5.5, §5.10, §11.7–11.9)."""
from datetime import timedelta

import pytest

from cells.models import Event, Run, RunCellState

from .support import at

pytestmark = pytest.mark.django_db


def _completed(run):
    run.create()
    run.ok("run_completed", event_data={"output": ["done"]})


# --------------------------------------------------------------------------- missing run


def test_it_answers_run_not_found_for_run_events_on_a_missing_run(run):
    for event_type, data in [("run_started", None), ("run_completed", {"output": 1}), ("run_failed", {}),
                             ("run_cancelled", None), ("step_created", {"stepName": "n"}),
                             ("wait_created", {"resumeAt": 0}), ("hook_conflict", {"token": "t"})]:
        kwargs = {} if data is None else {"event_data": data}
        outcome = run.refused("RUN_NOT_FOUND", event_type, "c1", **kwargs)
        assert outcome == {"ok": False, "code": "RUN_NOT_FOUND", "message": 'Workflow run "wrun_test" not found'}
    assert run.get_run() is None
    assert run.list_events()["data"] == []


def test_the_step_and_hook_guards_come_before_run_not_found(run):
    assert run.refused("STEP_NOT_FOUND", "step_started", "s1")["message"] == 'Step "s1" not found'
    assert run.refused("STEP_NOT_FOUND", "step_completed", "s1", {"result": 1})["message"] == 'Step "s1" not found'
    assert run.refused("STEP_NOT_FOUND", "step_retrying", "s1", {"error": "e"})["code"] == "STEP_NOT_FOUND"
    assert run.refused("STEP_NOT_FOUND", "step_failed", "s1", {"error": "e"})["code"] == "STEP_NOT_FOUND"
    assert run.refused("HOOK_NOT_FOUND", "hook_disposed", "h1")["message"] == 'Hook "h1" not found'
    assert run.refused("HOOK_NOT_FOUND", "hook_received", "h1", {"payload": 1})["code"] == "HOOK_NOT_FOUND"
    assert run.refused("RUN_NOT_FOUND", "hook_received", event_data={"payload": 1})["code"] == "RUN_NOT_FOUND"
    holder = {"runId": "wrun_other", "hookId": "h9"}
    assert run.refused("RUN_NOT_FOUND", "hook_created", "h1", {"token": "t"}, token_holder=holder)["code"]


def test_it_answers_run_not_found_for_an_unknown_event_type_on_a_missing_run(run):
    assert run.refused("RUN_NOT_FOUND", "run_exploded")["code"] == "RUN_NOT_FOUND"


def test_it_does_not_bootstrap_without_an_input_member(run):
    run.refused("RUN_NOT_FOUND", "run_started", event_data={"deploymentId": "d", "workflowName": "w"})
    run.refused("RUN_NOT_FOUND", "run_started", event_data={"deploymentId": "", "workflowName": "w", "input": 1})
    run.refused("RUN_NOT_FOUND", "run_started")
    assert run.get_run() is None


def test_it_mentions_the_run_when_run_started_finds_nothing(run):
    assert "wrun_test" in run.refused("RUN_NOT_FOUND", "run_started")["message"]


# --------------------------------------------------------------------------- terminal runs


def test_it_refuses_to_restart_a_completed_run(run):
    _completed(run)
    outcome = run.refused("RUN_EXPIRED", "run_started")
    assert outcome["message"] == 'Workflow run "wrun_test" is already in terminal state "completed"'
    assert run.get_run()["status"] == "completed"


@pytest.mark.parametrize("event_type,data", [
    ("run_completed", {"output": 2}), ("run_failed", {"error": "x"}), ("run_cancelled", None)])
def test_it_refuses_to_finish_a_completed_run_again(run, event_type, data):
    _completed(run)
    kwargs = {} if data is None else {"event_data": data}
    outcome = run.refused("ENTITY_CONFLICT", event_type, **kwargs)
    assert outcome["message"] == 'Cannot transition run from terminal state "completed"'
    assert run.event_types() == ["run_created", "run_completed"]


def test_it_cancels_a_cancelled_run_again_appending_an_event(run, frozen_clock):
    run.create()
    cancelled = run.ok("run_cancelled")["run"]
    frozen_clock.advance(10)
    outcome = run.ok("run_cancelled", event_data={"foo": 1})
    assert outcome["run"] == cancelled  # updatedAt does not move
    assert outcome["releasedHooks"] == []
    assert "eventData" not in outcome["event"]
    assert run.event_types() == ["run_created", "run_cancelled", "run_cancelled"]


@pytest.mark.parametrize("event_type,data", [
    ("step_created", {"stepName": "n"}), ("hook_created", {"token": "t"}), ("wait_created", {"resumeAt": 0})])
def test_it_creates_nothing_on_a_terminal_run(run, event_type, data):
    _completed(run)
    outcome = run.refused("ENTITY_CONFLICT", event_type, "c1", data)
    assert outcome["message"] == 'Cannot create new entities on run in terminal state "completed"'


def test_waits_and_hook_conflicts_still_append_on_a_terminal_run(run):
    _completed(run)
    run.ok("wait_completed", "w1")
    run.ok("hook_conflict", "h1", {"token": "t", "conflictingRunId": "wrun_x"})
    run.refused("HOOK_NOT_FOUND", "hook_received", "h1", {"payload": 1})
    assert run.event_types()[-2:] == ["wait_completed", "hook_conflict"]


# --------------------------------------------------------------------------- steps


@pytest.mark.parametrize("event_type,data", [
    ("step_started", None), ("step_completed", {"result": ["again"]}), ("step_failed", {"error": "e"}),
    ("step_retrying", {"error": "e"})])
def test_it_refuses_to_touch_a_completed_step(run, event_type, data):
    run.create()
    run.step("s1")
    run.ok("step_completed", "s1", {"result": ["ok"]})
    outcome = run.refused("ENTITY_CONFLICT", event_type, "s1", *([] if data is None else [data]))
    assert outcome["message"] == 'Cannot modify step in terminal state "completed"'
    step = run.get_step("s1")
    assert (step["status"], step["output"]) == ("completed", ["ok"])


def test_it_lets_steps_finish_on_a_cancelled_run(run):
    run.create()
    run.step("pending-step")
    run.ok("run_cancelled")
    # step_completed never reads the run (Q2), so it works even on a pending step
    assert run.ok("step_completed", "pending-step", {"result": 1})["step"]["status"] == "completed"


def test_a_terminal_run_refuses_to_start_a_pending_step_but_fails_a_running_one(run):
    run.create()
    run.step("pending-step")
    run.step("running-step")
    run.ok("step_started", "running-step")
    run.ok("run_cancelled")
    outcome = run.refused("RUN_EXPIRED", "step_started", "pending-step")
    assert outcome["message"] == 'Cannot modify non-running step on run in terminal state "cancelled"'
    run.refused("RUN_EXPIRED", "step_failed", "pending-step", {"error": "e"})
    failed = run.ok("step_failed", "running-step", {"error": {"notmessage": 1}})["step"]
    assert failed["error"] == {"message": "Unknown error"}
    assert run.ok("step_retrying", "pending-step", {"error": "e"})["step"]["status"] == "pending"


def test_it_refuses_an_early_start_with_whole_seconds_to_wait(run, frozen_clock):
    run.create()
    run.step("s1")
    retry_at = frozen_clock.now + timedelta(seconds=60)
    assert run.ok("step_retrying", "s1", {"error": "e", "retryAfter": retry_at})["step"]["retryAfter"] == retry_at
    frozen_clock.advance(3_001)
    outcome = run.refused("TOO_EARLY", "step_started", "s1")
    assert outcome == {
        "ok": False, "code": "TOO_EARLY",
        "message": 'Cannot start step "s1": retryAfter timestamp has not been reached yet',
        "retryAfterSeconds": 57,
    }
    frozen_clock.advance(56_998)  # 1 ms left -> still one whole second
    assert run.refused("TOO_EARLY", "step_started", "s1")["retryAfterSeconds"] == 1
    frozen_clock.advance(1)
    step = run.ok("step_started", "s1")["step"]
    assert "retryAfter" not in step and step["attempt"] == 1


def test_it_revives_an_untagged_retry_after_string(run, frozen_clock):
    run.create()
    run.step("s1")
    run.ok("step_retrying", "s1", {"error": "e", "retryAfter": "2099-01-01T00:00:00.000Z"})
    assert run.get_step("s1")["retryAfter"] == at("2099-01-01T00:00:00")
    seconds = run.refused("TOO_EARLY", "step_started", "s1")["retryAfterSeconds"]
    assert isinstance(seconds, int)
    assert seconds == -(-(int(at("2099-01-01T00:00:00").timestamp() * 1000) - frozen_clock.ms) // 1000)


def test_a_zero_retry_after_sets_no_retry_time_but_is_logged_as_epoch(run):
    run.create()
    run.step("s1")
    outcome = run.ok("step_retrying", "s1", {"error": "e", "retryAfter": 0})
    assert "retryAfter" not in outcome["step"]
    assert outcome["event"]["eventData"]["retryAfter"] == at("1970-01-01T00:00:00")
    run.ok("step_started", "s1")


# --------------------------------------------------------------------------- spec versions


def test_it_refuses_events_on_a_legacy_run_but_replays_its_creation(run):
    run.ok("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": 1}, specVersion=1)
    outcome = run.refused("LEGACY_RUN_NOT_SUPPORTED", "run_started")
    assert outcome == {
        "ok": False, "code": "LEGACY_RUN_NOT_SUPPORTED",
        "message": 'Run "wrun_test" was created with a legacy spec version (1) not supported by this world',
    }
    assert run.ok("run_created", event_data={})["run"]["specVersion"] == 1


def test_it_refuses_events_on_a_run_from_a_newer_world(run):
    run.ok("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": 1}, specVersion=4)
    outcome = run.refused("RUN_NOT_SUPPORTED", "run_cancelled")
    assert outcome == {
        "ok": False, "code": "RUN_NOT_SUPPORTED",
        "message": 'Run "wrun_test" requires a newer world (run specVersion 4, world 3)',
        "runSpecVersion": 4,
    }


def test_step_completed_skips_the_version_gate(run):
    run.create()
    run.step("s1")
    Run.objects.filter(cell__name="wrun_test").update(spec_version=1)
    run.refused("LEGACY_RUN_NOT_SUPPORTED", "step_started", "s1")
    run.ok("step_completed", "s1", {"result": 1})


def test_a_legacy_bootstrap_is_refused_yet_committed(run):
    outcome = run.refused("LEGACY_RUN_NOT_SUPPORTED", "run_started", specVersion=1,
                          event_data={"deploymentId": "d", "workflowName": "w", "input": 1})
    assert "(1)" in outcome["message"]
    assert run.get_run()["status"] == "pending"
    assert run.event_types() == ["run_created"]
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 0  # not advanced (Q1)


def test_a_newer_bootstrap_is_refused_yet_committed(run):
    run.refused("RUN_NOT_SUPPORTED", "run_started", specVersion=5,
                event_data={"deploymentId": "d", "workflowName": "w", "input": 1})
    assert run.get_run()["specVersion"] == 5
    assert Event.objects.filter(run__cell__name="wrun_test").count() == 1


def test_entities_take_the_spec_version_of_the_request(run):
    run.ok("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": 1}, specVersion=2)
    step = run.ok("step_created", "s1", {"stepName": "n"})["step"]
    assert step["specVersion"] == 3
    assert run.get_run()["specVersion"] == 2


# --------------------------------------------------------------------------- counter


def test_the_counter_only_moves_on_success(run):
    run.create()
    run.refused("STEP_NOT_FOUND", "step_started", "nope")
    run.ok("run_created", event_data={})  # replay: no event
    assert run.ok("run_started")["event"]["eventId"] == "wevt_z00000000000000000002"
    assert RunCellState.objects.get(name="wrun_test").event_sequence == 2
