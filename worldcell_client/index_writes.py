"""The index writes the world-celld client makes after a successful ``applyEvent``.

One pure function, ``index_calls_after_apply_event``, turns an ``applyEvent``
outcome into the ordered list of ``index`` binding calls the JS client makes
next (docs/protocol.md §6.1 key families, §6.3 steps 3–5). Two callers run
the same list: ``WorldClient.apply_event`` sends each call over the wire;
the console's *Cancel run* (``cells.operations``) invokes the index cell
in-process through the dispatch table. No Django, no Celery.
"""
from __future__ import annotations

import json
from typing import Any

from worldcell import codec

from .wire import encode_uri_component, ms13, shared_codec_dumps

__all__ = ["INDEX_CELL", "IndexCall", "index_calls_after_apply_event", "run_index_entries"]

#: The cell name the client uses for every global index (docs/protocol.md §4.3).
INDEX_CELL = "index"

#: ``(wire method of the index binding, positional arguments)``.
IndexCall = tuple[str, tuple[Any, ...]]


def _json_stringify(value: Any) -> str:
    """``JSON.stringify`` of plain data: compact, non-ASCII kept as it is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def run_index_entries(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``run:`` and ``runall:`` entries of a run entity (docs/protocol.md §6.1).

    Args:
        run: a run entity as ``applyEvent`` returns it (``runId``,
            ``workflowName``, ``status``, ``createdAt`` datetime).

    Returns ``[(key, value), (key, value)]``: the keys embed the 13-digit
    epoch ms of ``createdAt``; the value is the JSON *string*
    ``{"runId":…,"createdAt":"<ISO>","status":…}``.
    """
    created = run["createdAt"]
    at = ms13(codec.epoch_ms(created))
    meta = _json_stringify({"runId": run["runId"], "createdAt": codec.format_iso(created), "status": run["status"]})
    return [(f"run:{run['workflowName']}:{at}:{run['runId']}", meta), (f"runall:{at}:{run['runId']}", meta)]


def index_calls_after_apply_event(
    run_id: str, outcome: dict[str, Any], reserved: tuple[str, dict[str, Any]] | None = None
) -> list[IndexCall]:
    """The index calls that follow an ``ok: true`` ``applyEvent`` outcome, in the client's order.

    Args:
        run_id: the run (cell name) the event was applied to.
        outcome: the ``applyEvent`` result (``run``, ``hookToIndex``,
            ``releasedHooks``, ``event`` members, each optional).
        reserved: ``(token, owner)`` when the caller reserved a hook token
            before a ``hook_created`` event (docs/protocol.md §6.3 step 1).

    Returns ``[(method, args), …]``: ``put`` of the run's two keys; then
    ``finalizeHookIndexes`` for ``hookToIndex`` or, failing that,
    ``releaseHookToken`` of the reserved token; ``deleteHookIndexes`` per
    released hook; ``put`` of the event's ``correlation:`` key.
    """
    calls: list[IndexCall] = []
    run = outcome.get("run")
    if run is not None:
        calls.extend(("put", entry) for entry in run_index_entries(run))
    hook = outcome.get("hookToIndex")
    if hook is not None:
        owner = {"runId": hook["runId"], "hookId": hook["hookId"]}
        calls.append(("finalizeHookIndexes", (hook["token"], hook["hookId"], shared_codec_dumps(hook), owner)))
    elif reserved is not None:
        calls.append(("releaseHookToken", reserved))
    for released in outcome.get("releasedHooks") or []:
        owner = {"runId": run_id, "hookId": released["hookId"]}
        calls.append(("deleteHookIndexes", (released["token"], released["hookId"], owner)))
    event = outcome.get("event")
    if event is not None and event.get("correlationId"):
        key = (
            f"correlation:{encode_uri_component(event['correlationId'])}:"
            f"{ms13(codec.epoch_ms(event['createdAt']))}:{event['eventId']}:{run_id}"
        )
        calls.append(("put", (key, _json_stringify({"runId": run_id, "eventId": event["eventId"]}))))
    return calls
