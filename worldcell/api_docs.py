"""What ``/v1/docs`` says about each RPC method: argument shapes, result, an example (docs/protocol.md §4).

``METHODS[(binding, method)]`` holds, for every method the dispatch table
routes, its positional arguments (name, JSON Schema, description), its result
schema and an example argument array. ``worldcell.api`` turns it into one
documented ``POST /v1/rpc/<binding>/{name}/<method>`` operation each.

It cannot drift from the router: ``tests/ops/test_api_docs.py`` checks that
the keys are exactly the registered (binding, method) pairs, that the
argument names are the service method's parameters (the arity the router
passes, docs/protocol.md §2.6), and that every example is accepted by the
real validation through the real route. Dates travel as
``{"__type":"Date","iso":"…Z"}`` and bytes as ``{"__type":"Uint8Array","data":"<base64>"}`` (§3).
"""
from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

DATE: JSON = {
    "type": "object", "title": "Date", "required": ["__type", "iso"],
    "properties": {"__type": {"const": "Date"}, "iso": {"type": "string", "format": "date-time"}},
}
BYTES: JSON = {
    "type": "object", "title": "Uint8Array", "required": ["__type", "data"],
    "properties": {"__type": {"const": "Uint8Array"}, "data": {"type": "string", "format": "byte"}},
}
SERIALIZED: JSON = {"title": "SerializedData", "description": "bytes (Uint8Array) or any JSON value (§5.2)"}
ERROR_OBJ: JSON = {
    "type": "object", "title": "StructuredError", "required": ["message"],
    "properties": {"message": {"type": "string"}, "stack": {"type": "string"}, "code": {"type": "string"}},
}
RUN: JSON = {
    "type": "object", "title": "WorkflowRun", "required": ["runId", "status", "deploymentId", "workflowName", "createdAt", "updatedAt"],
    "properties": {
        "runId": {"type": "string"}, "status": {"enum": ["pending", "running", "completed", "failed", "cancelled"]},
        "deploymentId": {"type": "string"}, "workflowName": {"type": "string"}, "specVersion": {"type": "number"},
        "executionContext": {"type": "object"}, "input": SERIALIZED, "output": SERIALIZED, "error": ERROR_OBJ,
        "startedAt": DATE, "completedAt": DATE, "createdAt": DATE, "updatedAt": DATE,
    },
}
STEP: JSON = {
    "type": "object", "title": "Step", "required": ["runId", "stepId", "stepName", "status", "attempt", "createdAt", "updatedAt"],
    "properties": {
        "runId": {"type": "string"}, "stepId": {"type": "string"}, "stepName": {"type": "string"},
        "status": {"enum": ["pending", "running", "completed", "failed", "cancelled"]},
        "input": SERIALIZED, "output": SERIALIZED, "error": ERROR_OBJ, "attempt": {"type": "number"},
        "startedAt": DATE, "completedAt": DATE, "createdAt": DATE, "updatedAt": DATE, "retryAfter": DATE,
        "specVersion": {"type": "number"},
    },
}
HOOK: JSON = {
    "type": "object", "title": "Hook", "required": ["runId", "hookId", "token", "createdAt"],
    "properties": {
        "runId": {"type": "string"}, "hookId": {"type": "string"}, "token": {"type": "string"},
        "ownerId": {"type": "string"}, "projectId": {"type": "string"}, "environment": {"type": "string"},
        "metadata": SERIALIZED, "createdAt": DATE, "specVersion": {"type": "number"}, "isWebhook": {"type": "boolean"},
    },
}
EVENT: JSON = {
    "type": "object", "title": "Event", "required": ["eventType", "runId", "eventId", "createdAt"],
    "properties": {
        "eventType": {"type": "string"}, "correlationId": {"type": "string"}, "specVersion": {"type": "number"},
        "eventData": {"type": "object"}, "runId": {"type": "string"},
        "eventId": {"type": "string", "example": "wevt_z00000000000000000001"}, "createdAt": DATE, "occurredAt": DATE,
    },
}
LIST_PARAMS: JSON = {
    "type": ["object", "null"], "title": "ListParams", "description": "optional; may be null (§4.0 P1/P2)",
    "properties": {"limit": {"type": "integer", "minimum": 0}, "cursor": {"type": ["string", "null"]},
                   "sortOrder": {"enum": ["asc", "desc"]}},
}


def page(item: JSON, title: str) -> JSON:
    return {"type": "object", "title": title, "required": ["data", "cursor", "hasMore"],
            "properties": {"data": {"type": "array", "items": item}, "cursor": {"type": ["string", "null"]},
                           "hasMore": {"type": "boolean"}}}


OUTCOME: JSON = {
    "title": "Outcome", "description": "§5.7: success members appear only as §5.6 says; guard failures are HTTP 200 too",
    "oneOf": [
        {"type": "object", "required": ["ok", "releasedHooks"], "properties": {
            "ok": {"const": True}, "event": EVENT, "run": RUN, "step": STEP, "hook": HOOK, "hookToIndex": HOOK,
            "releasedHooks": {"type": "array", "items": {"type": "object", "properties": {
                "hookId": {"type": "string"}, "token": {"type": "string"}}}},
            "runCreated": {"type": "object", "properties": {"workflowName": {"type": "string"}, "createdAt": DATE}},
            "events": {"type": "array", "items": EVENT}}},
        {"type": "object", "required": ["ok", "code", "message"], "properties": {
            "ok": {"const": False}, "code": {"type": "string", "description": "§4.5 outcome code"},
            "message": {"type": "string"}, "retryAfterSeconds": {"type": "number"}, "runSpecVersion": {"type": "number"}}},
    ],
}
NULL: JSON = {"type": "null"}
HOLDER: JSON = {"type": "object", "properties": {"runId": {"type": "string"}, "hookId": {"type": "string"}}}
DEAD_LETTER: JSON = {"type": "object", "title": "DeadLetter", "description": "§7.7 dead-letter row"}

ENQUEUE_REQUEST: JSON = {
    "type": "object", "title": "EnqueueRequest", "required": ["messageId", "queueName", "pathname", "body", "config"],
    "properties": {
        "messageId": {"type": "string"}, "queueName": {"type": "string"}, "pathname": {"enum": ["flow", "step"]},
        "body": {"type": "string", "description": "POSTed to the app byte for byte"},
        "idempotencyKey": {"type": "string"}, "delaySeconds": {"type": "number"},
        "config": {"type": "object", "required": ["targetBaseUrl", "queueShards"], "properties": {
            "targetBaseUrl": {"type": "string", "format": "uri"}, "queueShards": {"type": "integer", "minimum": 1}}},
    },
}

_T = "2026-01-01T00:00:00.000Z"

#: (binding, method) -> {"summary", "args": [(name, schema, description)], "result", "example", "cell"}
METHODS: dict[tuple[str, str], JSON] = {
    ("runs", "applyEvent"): {
        "summary": "Apply one event to the run (the run-cell state machine, §5)",
        "args": [("request", {"type": "object", "title": "ApplyEventRequest", "required": ["runId", "data"], "properties": {
            "runId": {"type": "string"},
            "data": {"type": "object", "required": ["eventType"], "properties": {
                "eventType": {"type": "string", "description": "§5.3 event type"}, "correlationId": {"type": "string"},
                "specVersion": {"type": "number"}, "eventData": {"type": "object"}}},
            "tokenHolder": {"oneOf": [NULL, HOLDER]}}}, "§5.4")],
        "result": OUTCOME,
        "example": [{"runId": "wrun_docs", "data": {"eventType": "run_created", "specVersion": 2, "eventData": {
            "deploymentId": "dpl_1", "workflowName": "wf", "input": []}}}],
        "cell": "wrun_docs",
    },
    ("runs", "getRun"): {"summary": "The run, or null", "args": [], "result": {"oneOf": [RUN, NULL]}, "example": []},
    ("runs", "getStep"): {"summary": "One step by id, or null", "args": [("stepId", {"type": "string"}, "")],
                          "result": {"oneOf": [STEP, NULL]}, "example": ["step_1"]},
    ("runs", "getEvent"): {"summary": "One event by id, or null", "args": [("eventId", {"type": "string"}, "")],
                           "result": {"oneOf": [EVENT, NULL]}, "example": ["wevt_z00000000000000000001"]},
    ("runs", "listEvents"): {"summary": "Events in key order (P1, default limit 100)", "args": [("params", LIST_PARAMS, "")],
                             "result": page(EVENT, "EventPage"), "example": [{"limit": 10}]},
    ("runs", "listSteps"): {"summary": "Steps by creation time (P2, default limit 20)", "args": [("params", LIST_PARAMS, "")],
                            "result": page(STEP, "StepPage"), "example": [{"limit": 10, "sortOrder": "desc"}]},
    ("runs", "listHooks"): {"summary": "Live hooks by creation time (P2, default limit 100)", "args": [("params", LIST_PARAMS, "")],
                            "result": page(HOOK, "HookPage"), "example": [None]},
    ("streams", "writeChunk"): {"summary": "Append a chunk; its index", "args": [("data", {"oneOf": [BYTES, {"type": "string"}]}, "")],
                                "result": {"type": "integer"}, "example": [{"__type": "Uint8Array", "data": "aGk="}], "cell": "stream:docs"},
    ("streams", "closeStream"): {"summary": "Mark the stream done", "args": [], "result": NULL, "example": [], "cell": "stream:docs"},
    ("streams", "getChunks"): {"summary": "A page of chunks", "args": [("params", {"type": "object", "properties": {
        "startIndex": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 0}}}, "")],
        "result": {"type": "object", "properties": {"chunks": {"type": "array", "items": BYTES}, "done": {"type": "boolean"},
                                                     "tailIndex": {"type": "integer"}}},
        "example": [{"startIndex": 0, "limit": 32}], "cell": "stream:docs"},
    ("streams", "getInfo"): {"summary": "Tail index and done flag", "args": [], "result": {"type": "object", "properties": {
        "tailIndex": {"type": "integer"}, "done": {"type": "boolean"}}}, "example": [], "cell": "stream:docs"},
    ("streams", "registerStream"): {"summary": "Record a stream name in the run's registry", "args": [("name", {"type": "string"}, "")],
                                    "result": NULL, "example": ["stream:docs"], "cell": "run-streams:wrun_docs"},
    ("streams", "listStreams"): {"summary": "Sorted registered stream names", "args": [],
                                 "result": {"type": "array", "items": {"type": "string"}}, "example": [], "cell": "run-streams:wrun_docs"},
    ("index", "get"): {"summary": "The stored value, or null", "args": [("key", {"type": "string"}, "")], "result": {},
                       "example": ["run:wrun_docs"], "cell": "index"},
    ("index", "put"): {"summary": "Store (overwrite) a value", "args": [("key", {"type": "string"}, ""), ("value", {}, "any value")],
                       "result": NULL, "example": ["docs:key", "value"], "cell": "index"},
    ("index", "delete"): {"summary": "Delete a key (no error if missing)", "args": [("key", {"type": "string"}, "")],
                          "result": NULL, "example": ["docs:key"], "cell": "index"},
    ("index", "list"): {"summary": "Keys in order (P3, default limit 1000)", "args": [("options", {"type": ["object", "null"], "properties": {
        "prefix": {"type": "string"}, "cursor": {"type": "string"}, "limit": {"type": "integer"}, "reverse": {"type": "boolean"}}}, "")],
        "result": {"type": "object", "properties": {"keys": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}}}}, "list_complete": {"type": "boolean"}, "cursor": {"type": "string"}}},
        "example": [{"prefix": "run:", "limit": 10}], "cell": "index"},
    ("index", "reserveHookToken"): {"summary": "Claim a hook token for a hook (§6.3)", "args": [
        ("token", {"type": "string"}, ""), ("owner", HOLDER, "{runId, hookId}")],
        "result": {"oneOf": [{"type": "object", "properties": {"claimed": {"const": True}}},
                             {"type": "object", "properties": {"claimed": {"const": False}, "holder": HOLDER}}]},
        "example": ["tok_docs", {"runId": "wrun_docs", "hookId": "hook_1"}], "cell": "index"},
    ("index", "finalizeHookIndexes"): {"summary": "Publish a hook's index entries (§6.3)", "args": [
        ("token", {"type": "string"}, ""), ("hookId", {"type": "string"}, ""),
        ("serializedHook", {"type": "string"}, "the hook, storage-codec encoded"), ("owner", HOLDER, "")],
        "result": NULL, "example": None, "cell": "index"},
    ("index", "releaseHookToken"): {"summary": "Release a token this owner holds", "args": [
        ("token", {"type": "string"}, ""), ("owner", HOLDER, "")], "result": NULL,
        "example": ["tok_docs", {"runId": "wrun_docs", "hookId": "hook_1"}], "cell": "index"},
    ("index", "deleteHookIndexes"): {"summary": "Delete a hook's index entries", "args": [
        ("token", {"type": "string"}, ""), ("hookId", {"type": "string"}, ""), ("owner", HOLDER, "")], "result": NULL,
        "example": ["tok_docs", "hook_1", {"runId": "wrun_docs", "hookId": "hook_1"}], "cell": "index"},
    ("queue", "enqueue"): {"summary": "Store one message (§7.3)", "args": [("request", ENQUEUE_REQUEST, "")],
        "result": {"oneOf": [
            {"type": "object", "properties": {"ok": {"const": True}, "messageId": {"type": "string"}, "deduped": {"type": "boolean"}}},
            {"type": "object", "properties": {"ok": {"const": False}, "code": {"const": "CONFIG_MISMATCH"}, "message": {"type": "string"}}}]},
        "example": [{"messageId": "msg_docs", "queueName": "__wkf_step_docs", "pathname": "step", "body": "{}",
                     "delaySeconds": 3600, "config": {"targetBaseUrl": "http://127.0.0.1:9", "queueShards": 1}}],
        "cell": "q:0"},
    ("queue", "stats"): {"summary": "Counts and the alarm (§7.9)", "args": [], "result": {"type": "object", "properties": {
        "pending": {"type": "integer"}, "inflight": {"type": "integer"}, "deadLetters": {"type": "integer"},
        "alarmAt": {"type": ["integer", "null"], "description": "epoch ms"}}}, "example": [], "cell": "q:0"},
    ("queue", "listDeadLetters"): {"summary": "Dead letters (P4, default limit 100)", "args": [("params", {"type": ["object", "null"], "properties": {
        "limit": {"type": "integer"}, "cursor": {"type": "string"}}}, "")], "result": page(DEAD_LETTER, "DeadLetterPage"),
        "example": [{"limit": 10}], "cell": "q:0"},
    ("queue", "redriveDeadLetter"): {"summary": "Make a dead letter due again", "args": [("messageId", {"type": "string"}, "")],
        "result": {"type": "object", "properties": {"ok": {"type": "boolean"}}}, "example": ["msg_none"], "cell": "q:0"},
    ("queue", "purgeDeadLetters"): {"summary": "Delete every dead letter of the cell", "args": [],
        "result": {"type": "object", "properties": {"purged": {"type": "integer"}}}, "example": [], "cell": "q:9"},
    ("queue", "rearmAlarm"): {"summary": "Recompute the cell's alarm", "args": [],
        "result": {"type": "object", "properties": {"alarmAt": {"type": ["integer", "null"]}}}, "example": [], "cell": "q:0"},
}

#: The fixed error body of docs/protocol.md §2.9.
ERROR_BODY: JSON = {
    "type": "object", "title": "ErrorBody", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["name", "message"], "properties": {
        "name": {"type": "string", "example": "BadRequest"}, "message": {"type": "string"},
        "status": {"type": "integer", "description": "present when the method's error carried one"}}}},
}
ERROR_RESPONSES: dict[str, str] = {
    "400": "BadRequest: malformed body, not an argument array, malformed cell-name escape",
    "401": "Unauthorized: missing or wrong bearer token",
    "404": "NotFound: unknown binding or method, or not POST",
    "413": "PayloadTooLarge: body over 32 MiB",
    "500": "the method failed (validation, CellError, database error): its name and message",
    "503": "WorldNotConfigured: WORLD_SECRET is not set",
}


def request_body(entry: JSON) -> JSON:
    """The OpenAPI requestBody of one method: a JSON array of its positional arguments."""
    items = [{**schema, "title": name, **({"description": desc} if desc else {})} for name, schema, desc in entry["args"]]
    schema: JSON = {"type": "array", "prefixItems": items, "minItems": 0,
                    "description": "positional arguments; missing trailing ones are absent, extra ones ignored (§2.6)"}
    if not items:
        schema["maxItems"] = 0
    content: JSON = {"schema": schema}
    if entry.get("example") is not None:
        content["example"] = entry["example"]
    return {"required": True, "content": {"application/json": content}}


def responses(entry: JSON) -> dict[int, JSON]:
    out: dict[int, JSON] = {200: {"description": "the method's result (tagged JSON, §2.8)",
                         "content": {"application/json": {"schema": entry["result"]}}}}
    for status, text in ERROR_RESPONSES.items():
        out[int(status)] = {"description": text, "content": {"application/json": {"schema": ERROR_BODY}}}
    return out
