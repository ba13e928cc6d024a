"""Validation of what the run cell stores: events, runs, steps, hooks (docs/protocol.md §5.8).

Each ``validate_*`` function takes a wire-shaped dict and returns the object
that is stored: unknown members dropped at every declared level, datetimes
coerced, everything else checked strictly (a bool is not a number,
``specVersion: "3"`` is not a number, ``executionContext`` must be an object).
A failure raises ``worldcell.errors.ValidationError`` (HTTP 400) naming the
first failing field, e.g. ``step.stepId: expected string, received undefined``.

Strings that live in indexed columns are capped (checked before anything is
written, so an over-long value is a 400, never a database error):
``ID_MAX_BYTES`` (1024 UTF-8 bytes) for the run id, ``deploymentId``,
``workflowName``, step and hook ids and every ``correlationId``;
``TOKEN_MAX_BYTES`` (2038) for a hook ``token``. Other strings (``stepName``,
payloads) are not indexed and not capped.

Two kinds of absence meet here. A member that is not in the dict is *absent*
(JavaScript ``undefined``); ``None`` is JSON ``null``. ``compact`` turns
top-level ``null`` members into absent ones (§3.4) and is applied before every
validation; nested ``null`` stays a real value.
"""
from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Callable

from worldcell.codec import from_epoch_ms, parse_date_string, to_utc_ms
from worldcell.errors import ValidationError
from worldcell.keys import fits_utf8, storable_text

__all__ = [
    "ABSENT",
    "EVENT_TYPES",
    "ID_MAX_BYTES",
    "TOKEN_MAX_BYTES",
    "RUN_STATUSES",
    "STEP_STATUSES",
    "check_indexed_size",
    "compact",
    "member",
    "validate_event",
    "validate_hook",
    "validate_run",
    "validate_step",
]


class _Absent:
    """The value of a member that is not there (JavaScript ``undefined``)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()

RUN_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
STEP_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
EVENT_TYPES = (
    "run_created",
    "run_started",
    "run_completed",
    "run_failed",
    "run_cancelled",
    "step_created",
    "step_completed",
    "step_failed",
    "step_retrying",
    "step_started",
    "hook_created",
    "hook_received",
    "hook_disposed",
    "hook_conflict",
    "wait_created",
    "wait_completed",
)

#: ``new Date(x)`` is invalid beyond ±8.64e15 ms (ECMAScript TimeClip).
_MAX_JS_TIME_MS = 8.64e15

#: Largest run id, deployment id, workflow name, step id and hook id (= any
#: ``correlationId``), in UTF-8 bytes. Each of them is an indexed column (with
#: the run's integer id in front for step and hook ids), and a PostgreSQL btree
#: entry must fit 2704 bytes; a longer value would make the INSERT fail with
#: "index row size … exceeds btree maximum". Same cap as a stream name
#: (``cells.streams.NAME_MAX_BYTES``).
ID_MAX_BYTES = 1024
#: Largest hook token, in UTF-8 bytes (the token column is indexed on its own).
#: Same cap as the index cell's tokens (``cells.index.KEY_MAX_BYTES`` minus the
#: ``hookclaim:`` prefix), so every token the index cell can reserve fits here.
TOKEN_MAX_BYTES = 2048 - len("hookclaim:")


def compact(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` without its ``null`` members (shallow, docs/protocol.md §3.4)."""
    return {k: v for k, v in obj.items() if v is not None and v is not ABSENT}


def member(obj: Any, key: str) -> Any:
    """``obj[key]`` as JavaScript reads ``obj.key``: ABSENT when ``obj`` is no object or lacks it."""
    if isinstance(obj, dict) and key in obj:
        return obj[key]
    return ABSENT


# --------------------------------------------------------------------------- checks


def _received(value: Any) -> str:
    if value is ABSENT:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, (bytes, bytearray)):
        return "Uint8Array"
    if isinstance(value, datetime):
        return "Date"
    return "object"


def _fail(path: str, expected: str, value: Any) -> ValidationError:
    return ValidationError(f"{path}: expected {expected}, received {_received(value)}")


Check = Callable[[Any, str], Any]


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, "string", value)
    return value


def _column_string(value: Any, path: str) -> str:
    """A string that is also stored in a column of its own (see ``storable_text``)."""
    text = _string(value, path)
    if not storable_text(text):
        raise ValidationError(f"{path}: U+0000 and unpaired surrogates are not supported in ids and names")
    return text


def check_indexed_size(text: str, path: str, max_bytes: int) -> str:
    """``text`` if its UTF-8 form fits ``max_bytes``, else ValidationError naming ``path`` and the limit.

    ``text`` must already be storable (``storable_text``).
    """
    if not fits_utf8(text, max_bytes):
        raise ValidationError(f"{path}: longer than {max_bytes} UTF-8 bytes")
    return text


def _id_string(value: Any, path: str) -> str:
    """An id or name kept in an indexed column: storable and at most ``ID_MAX_BYTES``."""
    return check_indexed_size(_column_string(value, path), path, ID_MAX_BYTES)


def _token_string(value: Any, path: str) -> str:
    """A hook token (indexed column): storable and at most ``TOKEN_MAX_BYTES``."""
    return check_indexed_size(_column_string(value, path), path, TOKEN_MAX_BYTES)


def is_number(value: Any) -> bool:
    """A finite JSON number (``True``/``False`` are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a double
        return False


def _number(value: Any, path: str) -> int | float:
    if not is_number(value):
        raise _fail(path, "number", value)
    return value


def _boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, "boolean", value)
    return value


def _record(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "object", value)
    return value


def _any(value: Any, path: str) -> Any:
    return value


def coerce_date(value: Any, path: str) -> datetime:
    """``new Date(value)`` semantics (§5.8): a datetime, epoch ms, or a parseable string.

    ``null`` is epoch 0 and ``true`` is 1 ms (JavaScript ToNumber); fractions
    of a millisecond are truncated toward zero. Raises ValidationError for
    anything else, and for instants Python cannot represent (before year 1 or
    after 9999).
    """
    if isinstance(value, datetime):
        return to_utc_ms(value)
    if isinstance(value, str):
        parsed = parse_date_string(value)
        if parsed is None:
            raise ValidationError(f"{path}: invalid date {value[:64]!r}")
        return parsed
    if value is None or isinstance(value, bool):
        ms: int | float = int(bool(value))
    elif is_number(value):
        ms = value
    else:
        raise _fail(path, "date", value)
    if abs(ms) > _MAX_JS_TIME_MS:
        raise ValidationError(f"{path}: invalid date {ms!r}")
    try:
        return from_epoch_ms(math.trunc(ms))
    except (OverflowError, ValueError):
        raise ValidationError(f"{path}: date {ms!r} is out of range") from None


def _enum(options: tuple[str, ...]) -> Check:
    def check(value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValidationError(f"{path}: expected one of {'|'.join(options)}, received {value!r}"[:300])
        return value

    return check


class Shape:
    """An object schema: declared members are checked, unknown members dropped.

    ``fields`` maps a member name to ``(check, required)``. A member that is
    absent passes when not required; ``any``-typed members keep whatever value
    they have, ``null`` included.
    """

    def __init__(self, fields: dict[str, tuple[Check, bool]]):
        self.fields = fields

    def __call__(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(path, "object", value)
        out: dict[str, Any] = {}
        for name, (check, required) in self.fields.items():
            if name in value:
                out[name] = check(value[name], f"{path}.{name}")
            elif required:
                raise _fail(f"{path}.{name}", _expected(check), ABSENT)
        return out


def _expected(check: Check) -> str:
    return {
        _string: "string",
        _column_string: "string",
        _id_string: "string",
        _token_string: "string",
        _number: "number",
        _boolean: "boolean",
        _record: "object",
        coerce_date: "date",
    }.get(check, "object" if isinstance(check, Shape) else "value")


REQ, OPT = True, False

STRUCTURED_ERROR = Shape({"message": (_string, REQ), "stack": (_string, OPT), "code": (_string, OPT)})

_RUN = Shape(
    {
        "runId": (_string, REQ),
        "status": (_enum(RUN_STATUSES), REQ),
        "deploymentId": (_id_string, REQ),
        "workflowName": (_id_string, REQ),
        "specVersion": (_number, OPT),
        "executionContext": (_record, OPT),
        "input": (_any, OPT),
        "output": (_any, OPT),
        "error": (STRUCTURED_ERROR, OPT),
        "expiredAt": (coerce_date, OPT),
        "startedAt": (coerce_date, OPT),
        "completedAt": (coerce_date, OPT),
        "createdAt": (coerce_date, REQ),
        "updatedAt": (coerce_date, REQ),
    }
)

#: Members a run of each status must not have / must have (§5.2, status-discriminated union).
_RUN_FORBIDDEN = {
    "pending": ("output", "error", "completedAt"),
    "running": ("output", "error", "completedAt"),
    "cancelled": ("output", "error"),
    "completed": ("error",),
    "failed": ("output",),
}
_RUN_REQUIRED = {"cancelled": ("completedAt",), "completed": ("completedAt",), "failed": ("error", "completedAt")}

_STEP = Shape(
    {
        "runId": (_string, REQ),
        "stepId": (_id_string, REQ),
        "stepName": (_column_string, REQ),
        "status": (_enum(STEP_STATUSES), REQ),
        "input": (_any, OPT),
        "output": (_any, OPT),
        "error": (STRUCTURED_ERROR, OPT),
        "attempt": (_number, REQ),
        "startedAt": (coerce_date, OPT),
        "completedAt": (coerce_date, OPT),
        "createdAt": (coerce_date, REQ),
        "updatedAt": (coerce_date, REQ),
        "retryAfter": (coerce_date, OPT),
        "specVersion": (_number, OPT),
    }
)

_HOOK = Shape(
    {
        "runId": (_string, REQ),
        "hookId": (_id_string, REQ),
        "token": (_token_string, REQ),
        "ownerId": (_string, REQ),
        "projectId": (_string, REQ),
        "environment": (_string, REQ),
        "metadata": (_any, OPT),
        "createdAt": (coerce_date, REQ),
        "specVersion": (_number, OPT),
        "isWebhook": (_boolean, OPT),
    }
)

# eventData per event type (§5.3): (shape or None when the schema has no eventData, required?)
_EVENT_DATA: dict[str, tuple[Shape | None, bool]] = {
    "run_created": (
        Shape(
            {
                "deploymentId": (_string, REQ),
                "workflowName": (_string, REQ),
                "input": (_any, OPT),
                "executionContext": (_record, OPT),
            }
        ),
        REQ,
    ),
    "run_started": (
        Shape(
            {
                "input": (_any, OPT),
                "deploymentId": (_string, OPT),
                "workflowName": (_string, OPT),
                "executionContext": (_record, OPT),
            }
        ),
        OPT,
    ),
    "run_completed": (Shape({"output": (_any, OPT)}), REQ),
    "run_failed": (Shape({"error": (_any, OPT), "errorCode": (_string, OPT)}), REQ),
    "run_cancelled": (None, OPT),
    "step_created": (
        Shape({"stepName": (_string, REQ), "workflowName": (_string, OPT), "input": (_any, OPT)}),
        REQ,
    ),
    "step_completed": (
        Shape({"stepName": (_string, OPT), "workflowName": (_string, OPT), "result": (_any, OPT)}),
        REQ,
    ),
    "step_failed": (
        Shape({"stepName": (_string, OPT), "error": (_any, OPT), "stack": (_string, OPT)}),
        REQ,
    ),
    "step_retrying": (
        Shape(
            {
                "stepName": (_string, OPT),
                "error": (_any, OPT),
                "stack": (_string, OPT),
                "retryAfter": (coerce_date, OPT),
            }
        ),
        REQ,
    ),
    "step_started": (
        Shape({"stepName": (_string, OPT), "attempt": (_number, OPT), "workflowName": (_string, OPT)}),
        OPT,
    ),
    "hook_created": (
        Shape({"token": (_string, REQ), "metadata": (_any, OPT), "isWebhook": (_boolean, OPT)}),
        REQ,
    ),
    "hook_received": (Shape({"token": (_string, OPT), "payload": (_any, OPT)}), REQ),
    "hook_disposed": (Shape({"token": (_string, OPT)}), OPT),
    "hook_conflict": (Shape({"token": (_string, REQ), "conflictingRunId": (_string, OPT)}), REQ),
    "wait_created": (Shape({"resumeAt": (coerce_date, REQ)}), REQ),
    "wait_completed": (Shape({"resumeAt": (coerce_date, OPT)}), OPT),
}

_CORRELATION_OPTIONAL = frozenset({"run_created", "run_started", "run_completed", "run_failed", "run_cancelled"})

_EVENT_BASE = Shape(
    {
        "runId": (_string, REQ),
        "eventId": (_string, REQ),
        "createdAt": (coerce_date, REQ),
        "occurredAt": (coerce_date, OPT),
        "specVersion": (_number, OPT),
    }
)


def validate_run(run: dict[str, Any]) -> dict[str, Any]:
    """The WorkflowRun to store, or ValidationError (path ``run.<member>``)."""
    out = _RUN(compact(run), "run")
    status = out["status"]
    for name in _RUN_FORBIDDEN[status]:
        if name in out:
            raise ValidationError(f"run.{name}: must be absent when status is {status}")
    for name in _RUN_REQUIRED.get(status, ()):
        if name not in out:
            raise ValidationError(f"run.{name}: required when status is {status}")
    return out


def validate_step(step: dict[str, Any]) -> dict[str, Any]:
    """The Step to store, or ValidationError (path ``step.<member>``)."""
    return _STEP(compact(step), "step")


def validate_hook(hook: dict[str, Any]) -> dict[str, Any]:
    """The Hook to store, or ValidationError (path ``hook.<member>``)."""
    return _HOOK(compact(hook), "hook")


def validate_event(event: dict[str, Any]) -> dict[str, Any]:
    """The Event to store: the event union discriminated by ``eventType`` (§5.3)
    intersected with ``{runId, eventId, createdAt, occurredAt?, specVersion?}``.

    Raises ValidationError (path ``event.<member>``).
    """
    event = compact(event)
    event_type = _enum(EVENT_TYPES)(event.get("eventType", ABSENT), "event.eventType")
    out: dict[str, Any] = {"eventType": event_type}
    if "correlationId" in event:
        out["correlationId"] = _id_string(event["correlationId"], "event.correlationId")
    elif event_type not in _CORRELATION_OPTIONAL:
        raise _fail("event.correlationId", "string", ABSENT)
    shape, required = _EVENT_DATA[event_type]
    if shape is not None:
        if "eventData" in event:
            out["eventData"] = shape(event["eventData"], "event.eventData")
        elif required:
            raise _fail("event.eventData", "object", ABSENT)
    out.update(_EVENT_BASE(event, "event"))
    return out
