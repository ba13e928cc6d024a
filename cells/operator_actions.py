"""The console's actions on runs, as services callable from the shell and tests (docs/operations.md "Console actions").

Each action does what the Workflow SDK's own operator helpers do
(``@workflow/core`` ``runtime/runs``: ``recreateRunFromExisting``,
``wakeUpRun``, ``reenqueueRun``, as @workflow/web calls them), through the
same services the RPC route runs — the event state machine
(``RunCell.apply_event`` via ``cells.operations``) and the queue service
(``queueing.service.QueueCell.enqueue``) — never by writing rows:

* ``rerun_run`` — a new run of the same workflow, deployment, input and
  spec version: the ``run_created`` event and the workflow message that
  ``start()`` sends, the message to the original run's pinned target
  (its recorded workflow message: target URL and shard count), and a
  ``RunLink`` (new ↔ original), all in one transaction; then the run
  index writes of the client.
* ``wake_run`` — ``wait_completed`` for every open wait (sleep), then the
  workflow message again (``cells.repair.enqueue_once``), in one
  transaction under the run cell's lock.
* ``reenqueue_run`` — the workflow message again, under the stuck-run
  repair's rule (``enqueue_once``: once per run state, so a double click
  sends one message).
* ``cancel`` — ``cells.operations.cancel_run`` with the common result shape.
* ``run_many`` — one action over many runs (the console's bulk actions),
  each run on its own, a result per run.

Every function returns an ``ActionResult`` (``ok`` / ``skipped`` with why /
``failed`` with why) and raises nothing for a refusal; database errors
propagate from the single-run functions (``run_many`` reports them).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from django.db import IntegrityError, transaction

from worldcell import clock, codec
from worldcell_client.wire import shard_for, shared_codec_dumps, ulid

from . import repair
from .event_machine import TERMINAL_RUN, is_legacy_spec_version
from .models import Run
from .models.lineage import RunLink
from .models.tombstone import FlowMessageRecord, RunRepair
from .operations import CancelResult, cancel_run, write_client_index
from .runs import RunCell

log = logging.getLogger("cells.operator_actions")

__all__ = ["ActionResult", "TERMINAL", "cancel", "cancel_result", "new_request_key", "reenqueue_run", "rerun_run", "run_many",
           "wake_run"]

#: Run statuses after which nothing happens to a run by itself.
TERMINAL = TERMINAL_RUN  # the run statuses no event can leave (cells.event_machine)
#: ``SPEC_VERSION_SUPPORTS_CBOR_QUEUE_TRANSPORT`` of @workflow/world: from this spec version on,
#: ``start()`` also puts the run's input into the workflow message (``runInput``).
RUN_INPUT_IN_MESSAGE_FROM_SPEC = 3


@dataclass
class ActionResult:
    """What one action did to one run.

    Attributes:
        run_id: the run acted on.
        outcome: ``ok``, ``skipped`` (nothing was changed; ``message`` says
            why) or ``failed`` (refused by a service or an error; nothing of
            this action was committed, except as ``message`` says).
        message: for people, one line.
        new_run_id: *Re-run*: the new run.
        message_id, queue_cell: the workflow message enqueued, and where.
        completed_waits: *Wake up*: the correlation ids of the completed waits.
        index_error: the action committed, but the client's index writes
            after it failed (replaying repairs them).
    """

    run_id: str
    outcome: str
    message: str
    new_run_id: str | None = None
    message_id: str | None = None
    queue_cell: str | None = None
    completed_waits: list[str] = field(default_factory=list)
    index_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def _skipped(run_id: str, why: str) -> ActionResult:
    return ActionResult(run_id, "skipped", why)


def _failed(run_id: str, why: str) -> ActionResult:
    return ActionResult(run_id, "failed", why)


def new_request_key() -> str:
    """A key for one confirmation page (a ULID): *Re-run* starts one run per (run, key)."""
    return ulid()


def _number(value: float | None) -> int | float | None:
    """A stored spec version as the client sent it (``3``, not ``3.0``)."""
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def _rerun_plan(run: Run, record: FlowMessageRecord | None) -> tuple[str | None, dict[str, Any]]:
    """``(why not, the pieces of the re-run)`` for ``run``: why it cannot be re-run, or None and the plan."""
    if run.status not in TERMINAL:
        return f"still {run.status}: a run is re-run once it has finished (cancel it first)", {}
    spec = _number(run.spec_version)
    if is_legacy_spec_version(spec):
        return f"legacy spec version ({spec}): re-run it from the app", {}
    context = codec.decode(run.execution_context) if run.execution_context is not None else None
    features = context.get("features") if isinstance(context, dict) else None
    if isinstance(features, dict) and features.get("encryption"):
        return "its input is encrypted with the original run's key: re-run it from the app", {}
    if record is None:
        return "no workflow message was ever recorded for it, so its app's target URL is unknown", {}
    # the SDK's start() builds a fresh executionContext; its trace carrier is the caller's
    # trace context, which the console has none of ({}), the rest describes the input
    context = {**context, "traceCarrier": {}} if isinstance(context, dict) else {"traceCarrier": {}}
    return None, {"spec": spec, "context": context}


def rerun_run(run_id: str, *, request_key: str, user: str = "") -> ActionResult:
    """Start a new run of ``run_id``'s workflow with its input on its deployment, as the SDK's ``start()`` does.

    Args:
        run_id: the finished run to re-run.
        request_key: the confirmation's key (``new_request_key``): a second
            call with the same (run, key) starts nothing (``skipped``, names
            the run the first one started).
        user: recorded on the ``RunLink``.

    One transaction: the ``RunLink``, ``run_created`` for ``wrun_<ULID>``
    (specVersion and eventData ``deploymentId``, ``workflowName``, ``input``,
    ``executionContext``) and the message ``{runId, traceCarrier,
    runInput}`` on ``__wkf_workflow_<name>``, shard ``shard_for(messageId)``,
    to the target URL and shard count the original run's app used (its
    recorded workflow message). Then the client's run index writes.
    Skipped: an active run (as @workflow/web), legacy spec, an encrypted
    input (it cannot be decrypted here), no recorded workflow message.
    """
    from queueing.runref import FLOW_QUEUE_PREFIX
    from queueing.service import QueueCell

    run = Run.objects.select_related("cell").filter(cell__name=run_id, cell__expired=False).first()
    if run is None:
        return _skipped(run_id, "the run does not exist (or it expired)")
    done = RunLink.objects.filter(source_run_id=run_id, request_key=request_key).values_list("run_id", flat=True)
    if done.first() is not None:
        return ActionResult(run_id, "skipped", f"already re-run by this request as {done.first()}",
                            new_run_id=done.first())
    record = FlowMessageRecord.objects.filter(run_id=run_id).first()
    why, plan = _rerun_plan(run, record)
    if why is not None:
        return _skipped(run_id, why)
    assert record is not None

    new_id = f"wrun_{ulid()}"
    spec, context = plan["spec"], plan["context"]
    event_data: dict[str, Any] = {"deploymentId": run.deployment_id, "workflowName": run.workflow_name}
    run_input: dict[str, Any] = {}
    if run.input is not None:
        event_data["input"] = run_input["input"] = codec.decode(run.input)
    event_data["executionContext"] = context
    body: dict[str, Any] = {"runId": new_id, "traceCarrier": {}}
    if spec >= RUN_INPUT_IN_MESSAGE_FROM_SPEC:
        body["runInput"] = {**run_input, "deploymentId": run.deployment_id, "workflowName": run.workflow_name,
                            "specVersion": spec, "executionContext": context}
    message_id = f"msg_{ulid()}"
    cell = f"q:{shard_for(message_id, record.queue_shards)}"
    request = {
        "messageId": message_id, "queueName": FLOW_QUEUE_PREFIX + run.workflow_name, "pathname": "flow",
        "body": shared_codec_dumps(body),
        "config": {"targetBaseUrl": record.target_base_url, "queueShards": record.queue_shards},
    }
    with transaction.atomic():
        try:
            with transaction.atomic():
                RunLink.objects.create(run_id=new_id, source_run_id=run_id, kind="rerun", request_key=request_key,
                                       created_at=clock.now(), created_by=user)
        except IntegrityError:  # the same request, concurrently: the other one started the run
            first = RunLink.objects.filter(source_run_id=run_id, request_key=request_key).values_list("run_id", flat=True)
            return ActionResult(run_id, "skipped", f"already re-run by this request as {first.first()}",
                                new_run_id=first.first())
        outcome = RunCell(new_id).apply_event(
            {"runId": new_id, "data": {"eventType": "run_created", "specVersion": spec, "eventData": event_data}}
        )
        if not outcome.get("ok"):
            transaction.set_rollback(True)
            return _failed(run_id, f"run_created refused: {outcome.get('code')}: {outcome.get('message')}")
        answer = QueueCell(cell).enqueue(request)
        if not answer.get("ok"):
            transaction.set_rollback(True)
            return _failed(run_id, f"the queue refused the message: {answer.get('code')}: {answer.get('message')}")
    result = ActionResult(
        run_id, "ok", f"started {new_id} (workflow message {message_id} on {cell} to {record.target_base_url})",
        new_run_id=new_id, message_id=message_id, queue_cell=cell,
    )
    result.index_error = write_client_index(new_id, outcome)
    return result


def _lock_unfinished_run(run_id: str, finished_why: str) -> tuple[int, int] | ActionResult:
    """Lock run cell ``run_id`` in the caller's transaction (``cells.repair.lock_run``).

    Returns ``(cell id, event sequence)`` of a created, unexpired, unfinished
    run; otherwise the ``skipped`` result saying why (``finished_why`` ends
    the reason for a run that is finished or not created yet).
    """
    locked = repair.lock_run(run_id)
    if locked is None or locked[2]:
        return _skipped(run_id, "the run does not exist (or it expired)")
    cell_id, sequence, _, status = locked
    if status is None or status in TERMINAL:
        return _skipped(run_id, f"the run is {status or 'not created yet'}: {finished_why}")
    return cell_id, sequence


def wake_run(run_id: str) -> ActionResult:
    """End ``run_id``'s open sleeps now, as the SDK's ``wakeUpRun``: ``wait_completed`` each, then the message.

    One transaction under the run cell's lock (so two wake-ups cannot both
    complete a wait): for every open wait (``cells.repair.open_waits``, due
    or not) a ``wait_completed`` event with its ``correlationId``, the run's
    spec version and eventData ``{resumeAt}`` of the ``wait_created`` (just
    the correlation id for a legacy run), then the run's workflow message
    again (``cells.repair.enqueue_once``, keyed on the new state). Skipped:
    no such run, a finished run, no open wait, no recorded workflow message
    (checked before anything is written).
    """
    now_ms = clock.now_ms()
    with transaction.atomic():
        locked = _lock_unfinished_run(run_id, "nothing to wake")
        if isinstance(locked, ActionResult):
            return locked
        cell_id, sequence = locked
        waits = repair.open_waits(cell_id)
        if not waits:
            return _skipped(run_id, "no pending sleep (every wait_created has its wait_completed)")
        if not FlowMessageRecord.objects.filter(run_id=run_id).exists():
            return _skipped(run_id, "no workflow message was ever recorded for it, so it cannot be resumed from here")
        spec = _number(Run.objects.filter(cell_id=cell_id).values_list("spec_version", flat=True).first())
        outcomes = []
        for correlation_id, resume_at in waits.items():
            data: dict[str, Any] = {"eventType": "wait_completed", "correlationId": correlation_id}
            if not is_legacy_spec_version(spec):
                data["specVersion"] = spec
                data["eventData"] = {} if resume_at is None else {"resumeAt": resume_at}
            outcome = RunCell(run_id).apply_event({"runId": run_id, "data": data})
            if not outcome.get("ok"):
                transaction.set_rollback(True)
                return _failed(run_id, f"wait_completed for {correlation_id} refused: {outcome.get('code')}: "
                                       f"{outcome.get('message')}")
            outcomes.append(outcome)
        message_id, why = repair.enqueue_once(run_id, sequence + len(outcomes), now_ms, idle_since=now_ms)
        if message_id is None:
            transaction.set_rollback(True)
            return _failed(run_id, f"not woken: {why}")
    cell = RunRepair.objects.filter(run_id=run_id, message_id=message_id).values_list("queue_cell", flat=True).first()
    names = [c or "?" for c in waits]
    result = ActionResult(
        run_id, "ok", f"completed {len(names)} wait{'s' if len(names) != 1 else ''} ({', '.join(names)}); "
                      f"workflow message {message_id} on {cell}",
        message_id=message_id, queue_cell=cell, completed_waits=names,
    )
    errors = [e for e in (write_client_index(run_id, o) for o in outcomes) if e]
    result.index_error = errors[0] if errors else None
    return result


def reenqueue_run(run_id: str) -> ActionResult:
    """Send ``run_id``'s workflow message again, once per run state (the stuck-run repair's rule).

    One transaction under the run cell's lock: the run must exist, not be
    expired and not be finished; then ``cells.repair.enqueue_once`` with the
    run's current event sequence — a second call in the same state (a double
    click, a concurrent POST, the reconcile sweep) is ``skipped`` and names
    the message the first one sent.
    """
    now_ms = clock.now_ms()
    with transaction.atomic():
        locked = _lock_unfinished_run(run_id, "its workflow would do nothing")
        if isinstance(locked, ActionResult):
            return locked
        _, sequence = locked
        message_id, why = repair.enqueue_once(run_id, sequence, now_ms, idle_since=now_ms)
        if message_id is None:
            return _skipped(run_id, why)
    cell = RunRepair.objects.filter(run_id=run_id, event_sequence=sequence).values_list("queue_cell", flat=True).first()
    return ActionResult(
        run_id, "ok", f"workflow message {message_id} enqueued on {cell} (idempotency key "
                      f"{repair.repair_key(run_id, sequence)})",
        message_id=message_id, queue_cell=cell,
    )


def cancel(run_id: str) -> ActionResult:
    """``cells.operations.cancel_run`` as an ``ActionResult`` (already cancelled or finished: ``skipped``)."""
    return cancel_result(cancel_run(run_id))


def cancel_result(result: CancelResult) -> ActionResult:
    """A ``CancelResult`` in the common shape: ``ok``; ``skipped`` when already finished; else ``failed``."""
    if result.cancelled:
        hooks = ", ".join(h["hookId"] for h in result.released_hooks) or "none"
        out = ActionResult(result.run_id, "ok", f"cancelled with event {result.event_id} (released hooks: {hooks})")
        out.index_error = result.index_error
        return out
    finished = result.message.startswith(("already cancelled", "ENTITY_CONFLICT"))
    return ActionResult(result.run_id, "skipped" if finished else "failed", result.message)


def run_many(action: Callable[[str], ActionResult], run_ids: Iterable[str]) -> list[ActionResult]:
    """``action(run_id)`` for each run, in order, each on its own; one result per run.

    An exception from one run is logged and reported as ``failed`` (with
    its type and text); the others go on.
    """
    results = []
    for run_id in run_ids:
        try:
            results.append(action(run_id))
        except Exception as exc:  # noqa: BLE001 - reported per run, see docstring
            log.exception("console action on run %s failed", run_id)
            results.append(_failed(run_id, f"{type(exc).__name__}: {exc}"))
    return results
