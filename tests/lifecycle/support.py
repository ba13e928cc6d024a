"""Helpers of the lifecycle tests: a run with every kind of data, written as the JS client writes it.

``populate(rpc, run_id, …)`` drives one run through the RPC route — events,
steps, a live hook with its token indexes, the client's listing and
correlation index keys, a stream with chunks and its registry entry, flow
and step queue messages and a dead letter — and returns what it wrote, so
a test can check that retention removes all of it and nothing else.
"""
from __future__ import annotations

from typing import Any

from cells.lifecycle import correlation_key, listing_keys
from queueing.models import DeadLetter, Message, QueueCell
from tests.runs.support import RunClient
from tests.services import refused_url
from worldcell import codec
from worldcell_client import shared_codec_dumps

TARGET = refused_url()  # nothing listens there (tests/services.py)


def client_index_puts(rpc, run_id: str, outcome: dict[str, Any]) -> list[str]:
    """The index puts the v0.1 client makes after a successful applyEvent; returns the keys."""
    keys = []
    if outcome.get("run"):
        run = outcome["run"]
        meta = codec.encode({"runId": run_id, "status": run["status"]})
        for key in listing_keys(run_id, run["workflowName"], run["createdAt"]):
            rpc.ok("index", "index", "put", key, meta)
            keys.append(key)
    event = outcome.get("event") or {}
    if event.get("correlationId"):
        key = correlation_key(event["correlationId"], event["createdAt"], event["eventId"], run_id)
        rpc.ok("index", "index", "put", key, codec.encode({"runId": run_id, "eventId": event["eventId"]}))
        keys.append(key)
    return keys


def enqueue(rpc, queue_name: str, payload: dict, *, key: str | None = None, delay: float | None = None,
            cell: str = "q:0", message_id: str | None = None) -> dict:
    import uuid

    request: dict[str, Any] = {
        "messageId": message_id or f"msg_{uuid.uuid4().hex}",
        "queueName": queue_name,
        "pathname": "flow" if queue_name.startswith("__wkf_workflow_") else "step",
        "body": shared_codec_dumps(payload),
        "config": {"targetBaseUrl": TARGET, "queueShards": 1},
    }
    if key is not None:
        request["idempotencyKey"] = key
    if delay is not None:
        request["delaySeconds"] = delay
    return rpc.ok("queue", cell, "enqueue", request)


def populate(rpc, run_id: str, *, steps: int = 3, complete: bool = True, hook: bool = True,
             chunks: int = 3) -> dict[str, Any]:
    """Write a run with ``steps`` steps (and whatever else) as the client would; returns what was written."""
    run = RunClient(rpc, run_id)
    index_keys: list[str] = []
    created = run.create(workflow_name="wf")
    index_keys += client_index_puts(rpc, run_id, created)
    index_keys += client_index_puts(rpc, run_id, run.ok("run_started"))
    enqueue(rpc, "__wkf_workflow_wf", {"runId": run_id}, delay=3600)
    for i in range(steps):
        sid = f"step_{i}"
        index_keys += client_index_puts(rpc, run_id, run.step(sid))
        enqueue(rpc, "__wkf_step_wf", {"workflowName": "wf", "workflowRunId": run_id, "stepId": sid,
                                       "workflowStartedAt": 1}, key=f"{run_id}/{sid}", delay=3600)
        index_keys += client_index_puts(rpc, run_id, run.ok("step_started", sid, {"attempt": 1}))
        index_keys += client_index_puts(rpc, run_id, run.ok("step_completed", sid, {"result": [i]}))
    token = f"tok-{run_id}"
    if hook:
        hook_id = f"hook_{run_id}"
        assert rpc.ok("index", "index", "reserveHookToken", token, {"runId": run_id, "hookId": hook_id})["claimed"]
        out = run.hook(hook_id, token)
        rpc.ok("index", "index", "finalizeHookIndexes", token, hook_id, shared_codec_dumps(out["hook"]),
               {"runId": run_id, "hookId": hook_id})
        index_keys += client_index_puts(rpc, run_id, out)
    stream = f"strm_{run_id}"
    rpc.ok("streams", f"run-streams:{run_id}", "registerStream", stream)
    for i in range(chunks):
        rpc.ok("streams", f"stream:{stream}", "writeChunk", f"chunk {i}".encode())
    # a dead letter of the run (as the queue leaves one after its last attempt)
    cell = QueueCell.objects.get(name="q:0")
    DeadLetter.objects.create(
        cell=cell, dlq_key=f"dlq:0000000000001:msg_dead_{run_id}", message_id=f"msg_dead_{run_id}",
        queue_name="__wkf_step_wf", pathname="step",
        body=codec.encode(shared_codec_dumps({"workflowRunId": run_id, "stepId": "x"})),
        target_base_url=TARGET, attempt=5, enqueued_at=1, failed_at=1, run_id=run_id,
    )
    if complete:
        # the client deletes the hook indexes of released hooks itself
        done = run.ok("run_completed", event_data={"output": ["done"]})
        for released in done["releasedHooks"]:
            rpc.ok("index", "index", "deleteHookIndexes", released["token"], released["hookId"],
                   {"runId": run_id, "hookId": released["hookId"]})
        index_keys += client_index_puts(rpc, run_id, done)
    return {"index_keys": sorted(set(index_keys)), "stream": stream, "token": token,
            "messages": Message.objects.filter(run_id=run_id).count()}
