"""Helpers of the console-action tests: runs as the JS client writes them, with their workflow message recorded."""
from __future__ import annotations

from typing import Any

from cells.models import Run
from queueing.models import Message
from tests.lifecycle.support import enqueue
from tests.runs.support import RunClient
from tests.services import refused_url

TARGET = refused_url()  # the same as tests.lifecycle.support's: nothing listens there
INPUT = [b"\x00\x01args", {"n": 1}]


def client_run(rpc, run_id: str, *, workflow: str = "wf-order", status: str = "running",
               waits: tuple[tuple[str, str], ...] = (), keep_message: bool = False, **extra: Any) -> RunClient:
    """A run created and started as the client does, its workflow message enqueued (recorded), then consumed.

    ``status`` ``failed`` / ``completed`` / ``cancelled`` finishes it;
    ``waits`` = ``((correlationId, resumeAt ISO), …)`` adds open sleeps.
    ``keep_message``: leave the workflow message pending (else it is deleted,
    as an ack would).
    """
    from tests.runs.support import at

    run = RunClient(rpc, run_id)
    run.ok("run_created", event_data={"deploymentId": "dpl_7", "workflowName": workflow, "input": INPUT,
                                      "executionContext": {"traceCarrier": {"tp": "00-abc"}, "workflowCoreVersion": "4.6.0",
                                                           "features": {"encryption": False}}, **extra})
    enqueue(rpc, f"__wkf_workflow_{workflow}", {"runId": run_id, "traceCarrier": {"tp": "00-abc"}})
    run.ok("run_started")
    for corr, resume_at in waits:
        run.ok("wait_created", corr, {"resumeAt": at(resume_at)})
    if status == "failed":
        run.ok("run_failed", event_data={"error": {"message": "boom"}})
    elif status == "completed":
        run.ok("run_completed", event_data={"output": "done"})
    elif status == "cancelled":
        run.ok("run_cancelled")
    if not keep_message:
        Message.objects.filter(run_id=run_id).delete()
    return run


def pk(run_id: str) -> int:
    return Run.objects.get(cell__name=run_id).pk
