"""The run cell's event state machine: ``applyEvent`` (docs/protocol.md §5.5–5.7).

One call reads top to bottom (``cells.runs.RunCell.apply_event`` drives it):

1. ``read_request(cell_name, request)`` — validation of the envelope (§5.4)
   into an ``EventRequest``: event type, correlation id and the key it names,
   ``eventData``, spec version, token holder, each read once.
2. ``open_cell(cell, request)`` — the cell's row lock plus, in the same round
   trip, the rows this event type needs (``cells.run_store.LockedRunCell``).
3. ``apply_event(cell, request, now)`` — the §5.5 guards in their normative
   order, then the §5.6 effect of the type: the new entity is built and
   validated (``cells.event_schemas``), the event built and validated, and
   both writes queued on the cell. The caller then finishes the cell:
   everything written here commits or rolls back with that one transaction.

The steps, in the normative order of §5.5:

1. Load the run — except for ``run_created``, ``step_completed`` and
   ``step_retrying``, which never read it (so no version gate, terminal guard
   or RUN_NOT_FOUND applies to them, quirk Q2).
2. Resilient-start bootstrap: ``run_started`` on a missing run whose
   ``eventData`` has a truthy ``deploymentId`` and ``workflowName`` and an
   ``input`` member creates the run plus a synthetic ``run_created`` event.
3. Version gate: RUN_NOT_SUPPORTED (specVersion > 3), then
   LEGACY_RUN_NOT_SUPPORTED (absent or <= 1). A bootstrap that fails here
   stays committed (quirk Q1).
4. Terminal-run guards (``run_cancelled`` on a cancelled run appends and
   succeeds, quirk Q3).
5. Step guards: STEP_NOT_FOUND, terminal step, non-running step on a
   terminal run.
6. Hook guards: HOOK_NOT_FOUND for ``hook_disposed``/``hook_received``.
7. RUN_NOT_FOUND — after 5 and 6, so a missing run can answer STEP_NOT_FOUND
   or HOOK_NOT_FOUND first.
8. The per-type effect (§5.6), then the event counter is saved — only when
   the outcome is ``ok: true``.

Guard failures are *returned* (``{"ok": false, "code", "message"}``, HTTP 200).
Invalid input raises ``ValidationError`` (HTTP 400) and rolls back the whole
call: no event id is consumed. That includes a missing ``eventData`` where
the event type needs one, which upstream reports as a runtime ``TypeError``
(HTTP 500): worldcell treats it as the bad input it is.

Entities travel through this module as wire-shaped dicts (``runId``,
``createdAt``…); rows are read and written only through the ``LockedRunCell``
it is given, which read most of them when the cell was opened.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from worldcell import codec
from worldcell.errors import ValidationError
from worldcell.keys import storable_text

from .event_schemas import (
    ABSENT,
    compact,
    is_number,
    member,
    validate_event,
    validate_hook,
    validate_run,
    validate_step,
)
from .javascript import given, js_string, js_truthy
from .run_store import LockedRunCell

__all__ = ["SPEC_VERSION_CURRENT", "EventRequest", "apply_event", "format_event_id", "open_cell", "read_request"]

SPEC_VERSION_CURRENT = 3
EVENT_ID_PREFIX = "wevt_z"
RUN_STARTED_PRELOAD = 1000

TERMINAL_RUN = frozenset({"completed", "failed", "cancelled"})
TERMINAL_STEP = frozenset({"completed", "failed", "cancelled"})
STEP_EVENTS = frozenset({"step_started", "step_completed", "step_failed", "step_retrying"})
#: Event types that never read the run (§5.5 step 1).
RUN_NOT_READ = frozenset({"run_created", "step_completed", "step_retrying"})
RUN_EVENTS = frozenset({"run_created", "run_started", "run_completed", "run_failed", "run_cancelled"})
TERMINAL_RUN_EVENTS = frozenset({"run_completed", "run_failed", "run_cancelled"})
#: Event types that may create the run (and so the cell row).
RUN_CREATORS = frozenset({"run_created", "run_started"})
#: Event types that read the step / the hook their correlationId names.
STEP_READS = STEP_EVENTS | {"step_created"}
HOOK_READS = frozenset({"hook_created", "hook_disposed", "hook_received"})


def format_event_id(sequence: int) -> str:
    """``wevt_z`` + ``sequence`` zero-padded to 20 digits (§5.2)."""
    return f"{EVENT_ID_PREFIX}{sequence:020d}"


# --------------------------------------------------------------------------- spec versions and errors


def is_legacy_spec_version(version: Any) -> bool:
    """``isLegacySpecVersion``: absent, null, or <= 1."""
    return not given(version) or (is_number(version) and version <= 1)


def requires_newer_world(version: Any) -> bool:
    """``requiresNewerWorld``: present and > 3."""
    return is_number(version) and version > SPEC_VERSION_CURRENT


def to_structured_error(err: Any, *, stack: Any = ABSENT, code: Any = ABSENT) -> dict[str, Any]:
    """``toStructuredError`` (§5.6): message, stack and code out of any error value."""
    if isinstance(err, str):
        message = err
    elif isinstance(member(err, "message"), str):
        message = err["message"]
    else:
        message = "Unknown error"
    out: dict[str, Any] = {"message": message}
    if given(stack):
        out["stack"] = stack
    elif isinstance(member(err, "stack"), str):
        out["stack"] = err["stack"]
    if given(code):
        out["code"] = code
    elif isinstance(member(err, "code"), str):
        out["code"] = err["code"]
    return out


# --------------------------------------------------------------------------- outcomes


def failure(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """A returned guard failure (§4.5): HTTP 200 ``{"ok": false, …}``."""
    return {"ok": False, "code": code, "message": message, **extra}


def success(**members: Any) -> dict[str, Any]:
    """``{"ok": true, …}`` with ``releasedHooks`` always present (§5.7)."""
    members.setdefault("releasedHooks", [])
    return {"ok": True, **members}


# --------------------------------------------------------------------------- the machine


class EventRequest:
    """One ``applyEvent`` request, read once (§5.4): what ``open_cell`` and the machine look at.

    Attributes:
        run_id: the run id (= the cell name).
        data: the compacted ``data`` object (top-level ``null`` = absent, §3.4).
        token_holder: ``tokenHolder`` as sent, or ABSENT.
        event_type: ``data.eventType`` when a string or absent; None for any other
            value (it matches no branch: it reaches the default branch and fails
            event validation there (400), or RUN_NOT_FOUND).
        correlation_id, event_data: ``data.correlationId`` / ``data.eventData`` or ABSENT.
        key: ``String(correlationId)``: the id the step / hook is looked up by.
        spec_version: ``data.specVersion ?? 3``.
    """

    __slots__ = ("run_id", "data", "token_holder", "event_type", "correlation_id", "key", "event_data",
                 "spec_version")

    def __init__(self, run_id: str, data: dict[str, Any], token_holder: Any = ABSENT):
        self.run_id = run_id
        self.data = data
        self.token_holder = token_holder
        event_type = data.get("eventType", ABSENT)
        self.event_type = event_type if isinstance(event_type, str) or event_type is ABSENT else None
        self.correlation_id = data.get("correlationId", ABSENT)
        self.key = js_string(self.correlation_id)
        self.event_data = data.get("eventData", ABSENT)
        self.spec_version = data.get("specVersion", SPEC_VERSION_CURRENT)


def read_request(cell_name: str, request: Any) -> EventRequest:
    """Check the ``applyEvent`` envelope (§5.4) and read it into an ``EventRequest``.

    ``runId`` must be the cell name (§12 A9: worldcell rejects a mismatch);
    ``data`` must be an object and is compacted (top-level ``null`` = absent).
    Raises ValidationError (400) otherwise.
    """
    if not isinstance(request, dict):
        raise ValidationError("request: expected object")
    run_id = request.get("runId", ABSENT)
    if not isinstance(run_id, str):
        raise ValidationError("request.runId: expected string")
    if run_id != cell_name:
        raise ValidationError("request.runId: must equal the run cell name in the URL")
    data = request.get("data", ABSENT)
    if not isinstance(data, dict):
        raise ValidationError("request.data: expected object")
    return EventRequest(run_id, compact(data), request.get("tokenHolder", ABSENT))


def open_cell(cell: LockedRunCell, request: EventRequest) -> None:
    """Lock ``cell`` and read, in the same round trip, what ``request``'s event type needs.

    Only ``run_created`` and ``run_started`` can create a run, so only they
    create a missing cell row; for any other type a missing row means no run,
    no step and no hook, and the event can only be refused. What is read:
    the run (not for ``step_completed``/``step_retrying``, §5.5 step 1; all
    columns for ``run_*`` events, which return it), the step of a step event,
    the hook (and marker) of a hook event, the live hooks of a terminal
    transition, the ``run_started`` preload.
    """
    kind, key = request.event_type, request.key
    if kind in RUN_EVENTS:
        run = "full"  # returned in the outcome (run_created: the replay returns the stored run)
    elif kind in RUN_NOT_READ:
        run = None  # step_completed, step_retrying never read it
    else:
        run = "slim"  # the guards need status and specVersion only
    storable = storable_text(key)
    cell.open(
        create=kind in RUN_CREATORS,
        run=run,
        step_id=key if storable and kind in STEP_READS else None,
        hook_id=key if storable and kind in HOOK_READS else None,
        marker=kind == "hook_created",
        live_hooks=kind in TERMINAL_RUN_EVENTS,
        first_events=RUN_STARTED_PRELOAD if kind == "run_started" else None,
    )


def apply_event(cell: LockedRunCell, request: EventRequest, now: datetime) -> dict[str, Any]:
    """Apply ``request`` to the opened ``cell`` at ``now``: the §5.5 guards, then the §5.6 effect.

    Returns the outcome dict; the writes are queued on ``cell`` (the event
    counter too, for an ``ok: true`` outcome). Raises ValidationError /
    CellError (the caller then rolls everything back).
    """
    machine = _EventMachine(cell, request, now)
    outcome = machine.apply()
    if outcome["ok"] and machine.sequence != cell.event_sequence:
        cell.save_event_sequence(machine.sequence)
    return outcome


class _EventMachine:
    """One ``applyEvent`` call: the request, ``now``, the loaded run and the event counter."""

    def __init__(self, cell: LockedRunCell, request: EventRequest, now: datetime):
        self.cell = cell
        self.run_id = request.run_id
        self.data = request.data
        self.event_type = request.event_type
        self.correlation_id = request.correlation_id
        self.key = request.key
        self.event_data = request.event_data
        self.token_holder = request.token_holder
        self.spec_version = request.spec_version
        self.now = now
        self.sequence = cell.event_sequence
        self.run: dict[str, Any] | None = None

    # -- §5.5 --------------------------------------------------------------------------------

    def apply(self) -> dict[str, Any]:
        kind = self.event_type
        if kind not in RUN_NOT_READ:  # 1
            self.run = self.cell.load_run(full=kind in RUN_EVENTS)
        run_created = None
        if kind == "run_started" and self.run is None and js_truthy(self.event_data):  # 2
            run_created = self._bootstrap()
        if self.run is not None:  # 3
            refusal = self._version_gate()
            if refusal:
                return refusal
        if self.run is not None and self.run["status"] in TERMINAL_RUN:  # 4
            outcome = self._terminal_run_guard()
            if outcome:
                return outcome
        step = None
        if kind in STEP_EVENTS:  # 5
            step, refusal = self._step_guard()
            if refusal:
                return refusal
        if kind in ("hook_disposed", "hook_received") and js_truthy(self.correlation_id):  # 6
            if self.cell.load_hook(self.key) is None:
                return self._hook_not_found()
        if kind not in RUN_NOT_READ and kind != "run_started" and self.run is None:  # 7
            return self._run_not_found()
        return self._effect(step, run_created)  # 8

    def _bootstrap(self) -> dict[str, Any] | None:
        """§5.5 step 2: create the run (and a synthetic ``run_created``) from run_started's eventData."""
        data = self.event_data
        deployment_id = member(data, "deploymentId")
        workflow_name = member(data, "workflowName")
        run_input = member(data, "input")  # present counts, even as null
        if not (js_truthy(deployment_id) and js_truthy(workflow_name) and run_input is not ABSENT):
            return None
        execution_context = member(data, "executionContext")
        run = validate_run(
            {
                "runId": self.run_id,
                "deploymentId": deployment_id,
                "workflowName": workflow_name,
                "specVersion": self.spec_version,
                "executionContext": execution_context,
                "input": run_input,
                "status": "pending",
                "createdAt": self.now,
                "updatedAt": self.now,
            }
        )
        event_data = {"deploymentId": deployment_id, "workflowName": workflow_name, "input": run_input}
        if execution_context is not ABSENT:
            event_data["executionContext"] = execution_context
        self.cell.create_run(run)
        self._append({"eventType": "run_created", "eventData": event_data})
        self.run = run
        return {"workflowName": run["workflowName"], "createdAt": self.now}

    def _version_gate(self) -> dict[str, Any] | None:
        version = self.run.get("specVersion", ABSENT)
        if requires_newer_world(version):
            return failure(
                "RUN_NOT_SUPPORTED",
                f'Run "{self.run_id}" requires a newer world '
                f"(run specVersion {js_string(version)}, world {SPEC_VERSION_CURRENT})",
                runSpecVersion=version,
            )
        if is_legacy_spec_version(version):
            return failure(
                "LEGACY_RUN_NOT_SUPPORTED",
                f'Run "{self.run_id}" was created with a legacy spec version ({js_string(version)}) '
                "not supported by this world",
            )
        return None

    def _terminal_run_guard(self) -> dict[str, Any] | None:
        kind, status = self.event_type, self.run["status"]
        if kind == "run_cancelled" and status == "cancelled":  # Q3: appends, run unchanged
            return success(event=self._append(self.data), run=self.run)
        if kind == "run_started":
            return failure("RUN_EXPIRED", f'Workflow run "{self.run_id}" is already in terminal state "{status}"')
        if kind in ("run_completed", "run_failed", "run_cancelled"):
            return failure("ENTITY_CONFLICT", f'Cannot transition run from terminal state "{status}"')
        if kind in ("step_created", "hook_created", "wait_created"):
            return failure("ENTITY_CONFLICT", f'Cannot create new entities on run in terminal state "{status}"')
        return None

    def _step_guard(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        step_id = self.key
        step = self.cell.load_step(step_id)
        if step is None:
            return None, failure("STEP_NOT_FOUND", f'Step "{step_id}" not found')
        if step["status"] in TERMINAL_STEP:
            return None, failure("ENTITY_CONFLICT", f'Cannot modify step in terminal state "{step["status"]}"')
        if self.run is not None and self.run["status"] in TERMINAL_RUN and step["status"] != "running":
            return None, failure(
                "RUN_EXPIRED",
                f'Cannot modify non-running step on run in terminal state "{self.run["status"]}"',
            )
        return step, None

    def _hook_not_found(self) -> dict[str, Any]:
        return failure("HOOK_NOT_FOUND", f'Hook "{self.key}" not found')

    def _run_not_found(self) -> dict[str, Any]:
        return failure("RUN_NOT_FOUND", f'Workflow run "{self.run_id}" not found')

    # -- §5.6 --------------------------------------------------------------------------------

    def _effect(self, step: dict[str, Any] | None, run_created: dict[str, Any] | None) -> dict[str, Any]:
        kind = self.event_type
        if kind == "run_created":
            return self._run_created()
        if kind == "run_started":
            return self._run_started(run_created)
        if kind in ("run_completed", "run_failed", "run_cancelled"):
            return self._run_finished()
        if kind == "step_created":
            return self._step_created()
        if kind in STEP_EVENTS:
            return self._step_changed(step)
        if kind == "hook_created":
            return self._hook_created()
        if kind == "hook_disposed":
            return self._hook_disposed()
        # hook_received, hook_conflict, wait_created, wait_completed — and any unknown
        # type, which fails validation of the event here.
        return success(event=self._append(self.data))

    def _required_data(self, name: str) -> Any:
        """``data.eventData[name]``.

        Raises ValidationError (400) when ``eventData`` is missing; upstream
        dereferences it before validating and answers 500 ``TypeError`` (§5.8).
        """
        if self.event_data is ABSENT:
            raise ValidationError(
                f"data.eventData: required for {self.event_type} "
                f"(cannot read properties of undefined (reading '{name}'))"
            )
        return member(self.event_data, name)

    def _run_created(self) -> dict[str, Any]:
        existing = self.cell.load_run(full=True)
        if existing is not None:  # idempotent replay (Q9): no event, nothing validated
            return success(run=existing)
        deployment_id = self._required_data("deploymentId")
        data = self.event_data
        run = validate_run(
            {
                "runId": self.run_id,
                "deploymentId": deployment_id,
                "workflowName": member(data, "workflowName"),
                "specVersion": self.spec_version,
                "executionContext": member(data, "executionContext"),
                "input": member(data, "input"),
                "status": "pending",
                "createdAt": self.now,
                "updatedAt": self.now,
            }
        )
        event = self._build_event(self.data)
        self.cell.create_run(run)
        self.cell.store_event(event)
        return success(
            event=event, run=run, runCreated={"workflowName": run["workflowName"], "createdAt": self.now}
        )

    def _run_started(self, run_created: dict[str, Any] | None) -> dict[str, Any]:
        if self.run is None:
            return self._run_not_found()
        if self.run["status"] == "running":  # idempotent replay: no event, no change
            return success(run=self.run)
        run = {k: v for k, v in self.run.items() if k not in ("output", "error", "completedAt")}
        run.update(status="running", startedAt=self.run.get("startedAt", self.now), updatedAt=self.now)
        run = validate_run(run)
        event = self._build_event(self.data)
        self.cell.update_run(self.run, run)
        self.cell.store_event(event)
        outcome = success(event=event, run=run, events=self.cell.first_events(RUN_STARTED_PRELOAD))
        if run_created is not None:
            outcome["runCreated"] = run_created
        return outcome

    def _run_finished(self) -> dict[str, Any]:
        """run_completed / run_failed / run_cancelled on a non-terminal run."""
        kind = self.event_type
        run = {k: v for k, v in self.run.items() if k not in ("output", "error")}
        if kind == "run_completed":
            run.update(status="completed", output=self._required_data("output"))
        elif kind == "run_failed":
            error = self._required_data("error")
            code = member(self.event_data, "errorCode")
            run.update(status="failed", error=to_structured_error(error, code=code))
        else:
            run.update(status="cancelled")
        run.update(completedAt=self.now, updatedAt=self.now)
        run = validate_run(run)
        event = self._build_event(self.data)
        self.cell.update_run(self.run, run)
        self.cell.store_event(event)
        released = [{"hookId": hook_id, "token": token} for hook_id, token in self.cell.release_all_hooks()]
        return success(event=event, run=run, releasedHooks=released)

    def _step_created(self) -> dict[str, Any]:
        step_id = self.key
        if self.cell.load_step(step_id) is not None:
            return failure("ENTITY_CONFLICT", f'Step "{step_id}" already exists')
        step = validate_step(
            {
                "runId": self.run_id,
                "stepId": self.correlation_id,
                "stepName": self._required_data("stepName"),
                "status": "pending",
                "input": member(self.event_data, "input"),
                "attempt": 0,
                "createdAt": self.now,
                "updatedAt": self.now,
                "specVersion": self.spec_version,
            }
        )
        event = self._build_event(self.data)
        self.cell.create_step(step)
        self.cell.store_event(event)
        return success(event=event, step=step)

    def _step_changed(self, current: dict[str, Any]) -> dict[str, Any]:
        """step_started / step_completed / step_failed / step_retrying (step guards passed)."""
        kind, now = self.event_type, self.now
        step = dict(current)
        if kind == "step_started":
            retry_after = step.get("retryAfter")
            if retry_after is not None and retry_after > now:
                wait_ms = codec.epoch_ms(retry_after) - codec.epoch_ms(now)
                return failure(
                    "TOO_EARLY",
                    f'Cannot start step "{step["stepId"]}": retryAfter timestamp has not been reached yet',
                    retryAfterSeconds=max(1, -(-wait_ms // 1000)),
                )
            step.pop("retryAfter", None)
            step.update(status="running", startedAt=step.get("startedAt", now), attempt=step["attempt"] + 1)
        elif kind == "step_completed":
            step.update(status="completed", output=self._required_data("result"), completedAt=now)
        elif kind == "step_failed":
            error = self._required_data("error")
            stack = member(self.event_data, "stack")
            step.update(status="failed", error=to_structured_error(error, stack=stack), completedAt=now)
        else:  # step_retrying
            error = self._required_data("error")
            stack = member(self.event_data, "stack")
            step.update(status="pending", error=to_structured_error(error, stack=stack))
            retry_after = member(self.event_data, "retryAfter")
            if js_truthy(retry_after):  # Q8: retryAfter 0 is falsy
                step["retryAfter"] = retry_after
            else:
                step.pop("retryAfter", None)
        step["updatedAt"] = now
        step = validate_step(step)
        event = self._build_event(self.data)
        self.cell.update_step(current, step)
        self.cell.store_event(event)
        return success(event=event, step=step)

    def _hook_created(self) -> dict[str, Any]:
        hook_id = self.correlation_id
        token = self._required_data("token")
        holder = self.token_holder
        if js_truthy(holder) and (
            member(holder, "runId") != self.run_id or member(holder, "hookId") != hook_id
        ):  # the token belongs to another hook: record the conflict, create nothing
            conflict = {"token": token, "conflictingRunId": member(holder, "runId")}
            record = {
                "eventType": "hook_conflict",
                "correlationId": hook_id,
                "eventData": {k: v for k, v in conflict.items() if v is not ABSENT},
            }
            return success(event=self._append(record))
        key = js_string(hook_id)
        if self.cell.has_marker(key):
            existing = self.cell.load_hook(key)
            if existing is not None and not given(holder):  # crash-orphan repair: no event
                return success(hook=existing, hookToIndex=existing)
            return failure("ENTITY_CONFLICT", f'Hook "{key}" already created')
        is_webhook = member(self.event_data, "isWebhook")
        hook = validate_hook(
            {
                "runId": self.run_id,
                "hookId": hook_id,
                "token": token,
                "metadata": member(self.event_data, "metadata"),
                "ownerId": "",
                "projectId": "",
                "environment": "",
                "createdAt": self.now,
                "specVersion": self.spec_version,
                "isWebhook": is_webhook if given(is_webhook) else False,
            }
        )
        event = self._build_event(self.data)
        self.cell.create_hook(hook, event["eventId"])
        self.cell.store_event(event)
        return success(event=event, hook=hook, hookToIndex=hook)

    def _hook_disposed(self) -> dict[str, Any]:
        hook = self.cell.load_hook(self.key)
        if hook is None:  # an empty correlationId skipped the §5.5 step 6 guard
            return self._hook_not_found()
        event = self._build_event(self.data)
        self.cell.delete_hook(hook["hookId"])
        self.cell.store_event(event)
        return success(event=event, releasedHooks=[{"hookId": hook["hookId"], "token": hook["token"]}])

    # -- events --------------------------------------------------------------------------------

    def _build_event(self, record: dict[str, Any]) -> dict[str, Any]:
        """Take the next event id and build + validate the event record (§5.5 "append")."""
        self.sequence += 1
        event = dict(record)
        event.update(
            runId=self.run_id,
            eventId=format_event_id(self.sequence),
            createdAt=self.now,
            specVersion=self.spec_version,
        )
        if event.get("eventType") == "run_started":
            event.pop("eventData", None)
        return validate_event(event)

    def _append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Build, validate and store an event that comes with no entity change."""
        event = self._build_event(record)
        self.cell.store_event(event)
        return event
