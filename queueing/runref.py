"""Which run a queue message belongs to (docs/lifecycle.md "Queue messages").

The queue stores bodies opaquely; retention and stuck-run repair need to
find a run's messages by an index scan, so the run id a body names is read
once at enqueue and stored on the row (``Message.run_id``, ``DeadLetter.run_id``).
"""
from __future__ import annotations

from worldcell import codec

__all__ = ["FLOW_QUEUE_PREFIX", "STEP_QUEUE_PREFIX", "run_of_message"]

#: Queue name prefixes of the Workflow DevKit (``@workflow/world`` QueuePrefix).
FLOW_QUEUE_PREFIX = "__wkf_workflow_"
STEP_QUEUE_PREFIX = "__wkf_step_"


def run_of_message(queue_name: str, body: str) -> str | None:
    """The run id a message body names, or None.

    Workflow messages (``__wkf_workflow_*``) carry ``{"runId": …}``
    (WorkflowInvokePayload), step messages (``__wkf_step_*``)
    ``{"workflowRunId": …}`` (StepInvokePayload); the client encodes them
    with its storage codec, which is JSON for these members. Any other queue
    name, a body that is not a JSON object, or a missing/non-string member
    names no run.
    """
    if queue_name.startswith(FLOW_QUEUE_PREFIX):
        member = "runId"
    elif queue_name.startswith(STEP_QUEUE_PREFIX):
        member = "workflowRunId"
    else:
        return None
    if member not in body:
        return None
    try:
        payload = codec.decode(body)
    except Exception:  # noqa: BLE001 - an opaque body names no run
        return None
    run_id = payload.get(member) if isinstance(payload, dict) else None
    if not isinstance(run_id, str) or not run_id or "\x00" in run_id or len(run_id) > 1024:
        return None
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return run_id
