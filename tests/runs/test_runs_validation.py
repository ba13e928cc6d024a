"""Validation of events and entities, and rollback on failure (docs/protocol.md §3.4, §5.8, §11.9).

worldcell answers upstream's 500 ``ZodError`` with 400 ``ValidationError``
(deviation 1), and so is upstream's runtime ``TypeError`` for a missing
``eventData``: bad input is never a 500 here.
"""
import pytest

from cells.models import Run, RunCellState, Step

from .support import RunClient, at

pytestmark = pytest.mark.django_db


def _rejected(run, *args, **kwargs) -> str:
    status, body = run.send(*args, **kwargs)
    assert status == 400, (status, body)
    assert body["error"]["name"] == "ValidationError"
    return body["error"]["message"]


def test_a_rejected_event_consumes_no_event_id(run):
    run.create()
    message = _rejected(run, "step_created", event_data={"stepName": "n"})
    assert message.startswith("step.stepId")
    assert run.list_steps()["data"] == []
    assert run.ok("step_created", "s1", {"stepName": "n"})["event"]["eventId"] == "wevt_z00000000000000000002"


def test_a_rejected_first_event_leaves_nothing_behind(run):
    _rejected(run, "run_created", event_data={"deploymentId": "d", "workflowName": "w", "executionContext": None})
    assert not RunCellState.objects.filter(name="wrun_test").exists()
    assert run.get_run() is None


@pytest.mark.parametrize("event_data", [
    {"deploymentId": "d", "workflowName": "w", "executionContext": None},
    {"deploymentId": "d", "workflowName": "w", "executionContext": [1]},
    {"deploymentId": "d", "workflowName": 5},
    {"deploymentId": True, "workflowName": "w"},
    {"workflowName": "w"},
])
def test_it_rejects_a_malformed_run_created(run, event_data):
    _rejected(run, "run_created", event_data=event_data)
    assert run.get_run() is None


@pytest.mark.parametrize("spec_version", ["3", True, [3], {"v": 3}])
def test_it_rejects_a_spec_version_that_is_not_a_number(run, spec_version):
    message = _rejected(run, "run_created", event_data={"deploymentId": "d", "workflowName": "w"},
                        specVersion=spec_version)
    assert "specVersion" in message


def test_a_rejected_run_started_leaves_the_run_pending(run):
    run.create()
    _rejected(run, "run_started", specVersion="3")
    assert run.get_run()["status"] == "pending"
    assert run.event_types() == ["run_created"]


def test_a_replayed_run_created_is_not_validated(run):
    run.create()
    run.ok("run_created", event_data={"executionContext": [1]}, specVersion="3")


def test_it_rejects_hook_created_with_a_null_is_webhook(run):
    run.create()
    _rejected(run, "hook_created", "h1", {"token": "t", "isWebhook": None})
    assert run.list_hooks()["data"] == []


def test_it_rejects_wait_created_without_resume_at(run):
    run.create()
    assert "resumeAt" in _rejected(run, "wait_created", "w1", {})


@pytest.mark.parametrize("resume_at,stored", [
    ("2030-01-01T00:00:00Z", "2030-01-01T00:00:00"),
    (0, "1970-01-01T00:00:00"),
    (1_000.9, "1970-01-01T00:00:01"),
    (True, "1970-01-01T00:00:00.001"),
    (None, "1970-01-01T00:00:00"),
    ("2030-01-01", "2030-01-01T00:00:00"),
])
def test_it_coerces_wait_times_to_dates(run, resume_at, stored):
    run.create()
    event = run.ok("wait_created", "w1", {"resumeAt": resume_at})["event"]
    assert event["eventData"]["resumeAt"] == at(stored)
    assert run.get_event(event["eventId"])["eventData"]["resumeAt"] == at(stored)


@pytest.mark.parametrize("resume_at", ["garbage", "", [1], {"a": 1}, 9e15, b"x"])
def test_it_rejects_what_is_no_date(run, resume_at):
    run.create()
    assert "resumeAt" in _rejected(run, "wait_created", "w1", {"resumeAt": resume_at})


def test_it_rejects_an_unknown_event_type_on_an_existing_run(run):
    run.create()
    assert "eventType" in _rejected(run, "run_exploded")


def test_it_rejects_a_step_event_without_a_correlation_id(run):
    run.create()
    _rejected(run, "wait_completed")
    _rejected(run, "hook_received", event_data={"payload": 1})


@pytest.mark.parametrize("event_type,member", [
    ("run_completed", "output"), ("run_failed", "error")])
def test_it_answers_400_where_upstream_dereferences_missing_event_data(run, event_type, member):
    run.create()
    status, body = run.send(event_type)
    assert status == 400
    assert body == {"error": {"name": "ValidationError", "message": (
        f"data.eventData: required for {event_type} (cannot read properties of undefined (reading '{member}'))")}}
    assert run.get_run()["status"] == "pending"


def test_it_answers_400_for_step_events_without_event_data(run):
    run.create()
    run.step("s1")
    for event_type in ("step_completed", "step_failed", "step_retrying"):
        status, body = run.send(event_type, "s1")
        assert (status, body["error"]["name"]) == (400, "ValidationError")
    status, body = run.send("step_created", "s2")
    assert (status, body["error"]["name"]) == (400, "ValidationError")
    assert run.get_step("s1")["status"] == "pending"


def test_it_drops_unknown_members(run):
    outcome = run.ok("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": 1, "x": 2},
                     correlationId=None, extra="dropped")
    event = run.get_event(outcome["event"]["eventId"])
    assert "extra" not in event and "correlationId" not in event
    assert event["eventData"] == {"deploymentId": "d", "workflowName": "w", "input": 1}
    run.ok("run_started", event_data={"deploymentId": "d", "workflowName": "w", "input": 1})
    assert "eventData" not in run.list_events()["data"][-1]


def test_it_keeps_and_coerces_occurred_at(run):
    event = run.create(occurredAt=None)["event"]
    assert "occurredAt" not in event
    event = run.ok("wait_created", "w", {"resumeAt": 0}, occurredAt="2026-01-01T00:00:00.5Z")["event"]
    assert event["occurredAt"] == at("2026-01-01T00:00:00.500")


def test_it_treats_top_level_nulls_as_absent(run):
    run.create()
    run.step("s1")
    assert run.ok("step_started", "s1", None, specVersion=None)["event"]["specVersion"] == 3


def test_nested_nulls_are_real_values(run):
    run.create()
    run.step("s1")
    _rejected(run, "step_failed", "s1", {"error": "e", "stack": None})
    outcome = run.ok("hook_created", "h1", {"token": "t", "metadata": None})
    assert "metadata" not in outcome["hook"]
    assert outcome["event"]["eventData"] == {"token": "t", "metadata": None}


def test_it_rejects_a_non_string_stack_on_the_step(run):
    run.create()
    run.step("s1")
    assert _rejected(run, "step_failed", "s1", {"error": "e", "stack": 5}).startswith("step.error.stack")


def test_it_rejects_a_malformed_envelope(rpc):
    run = RunClient(rpc, "wrun_env")
    for request in ([], "x", {"data": {"eventType": "run_created"}}, {"runId": "wrun_env"},
                    {"runId": "wrun_other", "data": {"eventType": "run_created"}}):
        status, body = rpc("runs", "wrun_env", "applyEvent", request)
        assert status == 400 and body["error"]["name"] == "ValidationError", (request, body)
    status, _ = rpc("runs", "wrun_env", "applyEvent")
    assert status == 400
    assert run.get_run() is None


def test_it_rejects_nul_in_ids_and_names(run):
    run.create()
    _rejected(run, "step_created", "s\u0000", {"stepName": "n"})
    _rejected(run, "step_created", "s1", {"stepName": "n\u0000"})
    _rejected(run, "step_created", "s1", {"stepName": "\ud800"})
    assert run.get_step("s\u0000") is None
    assert Step.objects.count() == 0


def test_it_stores_numbers_as_the_client_sent_them(run):
    run.ok("run_created", event_data={"deploymentId": "d", "workflowName": "w", "input": [1.5, 2, -0.25]},
           specVersion=3.0)
    got = run.get_run()
    assert got["input"] == [1.5, 2, -0.25]
    assert got["specVersion"] == 3 and isinstance(got["specVersion"], int)
    assert Run.objects.get().spec_version == 3.0


# ---------------------------------------------------------------------------- fuzz

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402

from cells.event_schemas import EVENT_TYPES  # noqa: E402

_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.sampled_from(["", "s1", "h1", "tok", "wrun_other"]),
              st.binary(max_size=3), st.just(at("2030-01-01T00:00:00"))),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.sampled_from(["message", "stack", "code", "runId", "hookId", "x"]), inner, max_size=3)),
    max_leaves=6,
)
_event_data = st.one_of(_values, st.dictionaries(
    st.sampled_from(["deploymentId", "workflowName", "input", "executionContext", "output", "error", "errorCode",
                     "stepName", "result", "stack", "retryAfter", "attempt", "token", "metadata", "isWebhook",
                     "payload", "conflictingRunId", "resumeAt", "x"]), _values, max_size=6))
_data = st.fixed_dictionaries({}, optional={
    "eventType": st.one_of(st.sampled_from(EVENT_TYPES), _values),
    "correlationId": st.one_of(st.sampled_from(["s1", "h1", ""]), _values),
    "specVersion": st.one_of(st.sampled_from([1, 2, 3, 4]), _values),
    "eventData": _event_data,
    "occurredAt": _values,
})


_fuzz_runs = iter(range(10**9))


@hsettings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(created=st.booleans(), events=st.lists(st.tuples(_data, st.one_of(st.none(), _values)), max_size=12))
def test_random_events_never_break_the_log(rpc, created, events):
    run = RunClient(rpc, f"wrun_fuzz_{next(_fuzz_runs)}")
    if created:
        run.create()
    for data, holder in events:
        status, body = run.rpc("runs", run.run_id, "applyEvent", {"runId": run.run_id, "data": data, "tokenHolder": holder})
        if status == 200 and body["ok"]:
            assert isinstance(body["releasedHooks"], list)
        elif status == 200:
            assert {"code", "message"} <= set(body) <= {"ok", "code", "message", "retryAfterSeconds", "runSpecVersion"}
        else:
            assert (status, body["error"]["name"]) == (400, "ValidationError"), (status, body)
    ids = run.event_ids()
    assert ids == [f"wevt_z{n:020d}" for n in range(1, len(ids) + 1)]
    cell = RunCellState.objects.filter(name=run.run_id).first()
    assert (cell.event_sequence if cell else 0) in (len(ids), len(ids) - 1)  # Q1 may leave one behind
    for step in run.list_steps({"limit": 1000})["data"]:
        assert run.get_step(step["stepId"]) == step


# ---------------------------------------------------------------------------- indexed string caps

import secrets  # noqa: E402

from cells.event_schemas import ID_MAX_BYTES, TOKEN_MAX_BYTES  # noqa: E402


def _random_text(size: int) -> str:
    """``size`` characters that do not compress (PostgreSQL compresses long index
    entries, so a repetitive string would slip under the btree limit)."""
    return secrets.token_urlsafe(size)[:size]


LONG = _random_text(3000)


def test_the_caps_match_the_index_and_streams_cells():
    from cells.index import KEY_MAX_BYTES
    from cells.streams import NAME_MAX_BYTES

    assert ID_MAX_BYTES == NAME_MAX_BYTES == 1024
    assert TOKEN_MAX_BYTES == KEY_MAX_BYTES - len("hookclaim:") == 2038


def test_an_over_long_run_id_is_a_400_and_writes_nothing(rpc):
    # Regression: a ~3000-char random run id was a 500 OperationalError on
    # PostgreSQL ("index row size … exceeds btree version 4 maximum 2704").
    run = RunClient(rpc, "wrun_" + LONG)
    message = _rejected(run, "run_created", event_data={"deploymentId": "d", "workflowName": "w"})
    assert message == f"run id: longer than {ID_MAX_BYTES} UTF-8 bytes"
    assert RunCellState.objects.count() == 0
    assert run.get_run() is None
    assert run.list_events() == {"data": [], "cursor": None, "hasMore": False}
    assert run.get_step("s1") is None


def test_ids_at_the_caps_are_stored(rpc):
    # UTF-8 bytes count, not characters: "é" is 2 bytes.
    at_cap = "é" * (ID_MAX_BYTES // 2)
    run = RunClient(rpc, "wrun_" + _random_text(ID_MAX_BYTES - len("wrun_")))
    run.create(workflow_name=_random_text(ID_MAX_BYTES), deploymentId=at_cap)
    run.ok("run_started")
    run.step(_random_text(ID_MAX_BYTES))
    run.hook(at_cap, _random_text(TOKEN_MAX_BYTES))
    run.ok("wait_created", _random_text(ID_MAX_BYTES), {"resumeAt": 0})
    assert run.get_run()["deploymentId"] == at_cap
    assert run.list_hooks()["data"][0]["hookId"] == at_cap
    assert [s["stepId"] for s in run.list_steps()["data"]] == [run.list_steps()["data"][0]["stepId"]]
    assert run.ok("run_completed", event_data={})["releasedHooks"][0]["hookId"] == at_cap


@pytest.mark.parametrize("member", ["deploymentId", "workflowName"])
def test_an_over_long_deployment_or_workflow_is_a_400(run, member):
    event_data = {"deploymentId": "d", "workflowName": "w", "input": 1, member: LONG}
    assert _rejected(run, "run_created", event_data=event_data) == f"run.{member}: longer than 1024 UTF-8 bytes"
    assert _rejected(run, "run_started", event_data=event_data) == f"run.{member}: longer than 1024 UTF-8 bytes"
    assert not RunCellState.objects.filter(name="wrun_test").exists()
    assert _rejected(run, "run_created", event_data={**event_data, member: "é" * 513}).endswith("1024 UTF-8 bytes")


@pytest.mark.parametrize("event_type,event_data,path", [
    ("step_created", {"stepName": "n"}, "step.stepId"),
    ("hook_created", {"token": "t"}, "hook.hookId"),
    ("wait_created", {"resumeAt": 0}, "event.correlationId"),
    ("hook_conflict", {"token": "t"}, "event.correlationId"),
    ("hook_received", {"payload": 1}, None),  # the hook cannot exist: HOOK_NOT_FOUND, nothing written
    ("wait_completed", None, "event.correlationId"),
])
def test_an_over_long_correlation_id_is_a_400(run, event_type, event_data, path):
    run.create()
    if path is None:
        assert run.refused("HOOK_NOT_FOUND", event_type, LONG, event_data)
    else:
        args = (event_type, LONG) if event_data is None else (event_type, LONG, event_data)
        assert _rejected(run, *args) == f"{path}: longer than 1024 UTF-8 bytes"
    assert run.event_types() == ["run_created"]
    assert run.ok("wait_completed", "w")["event"]["eventId"] == "wevt_z00000000000000000002"


def test_an_over_long_hook_id_in_a_token_conflict_is_a_400(run):
    run.create()
    holder = {"runId": "wrun_other", "hookId": "h"}
    assert _rejected(run, "hook_created", LONG, {"token": "t"}, token_holder=holder) == (
        "event.correlationId: longer than 1024 UTF-8 bytes")
    assert run.event_types() == ["run_created"]


def test_an_over_long_token_is_a_400(run):
    run.create()
    message = _rejected(run, "hook_created", "h1", {"token": _random_text(TOKEN_MAX_BYTES + 1)})
    assert message == f"hook.token: longer than {TOKEN_MAX_BYTES} UTF-8 bytes"
    assert run.list_hooks()["data"] == []
    assert run.ok("hook_created", "h1", {"token": "t"})["event"]["eventId"] == "wevt_z00000000000000000002"
