"""Operator actions on runs, done the way the world-celld client would do them (PROTOCOL.md §5, §6.3).

The admin never edits event-sourced rows. An operator's "cancel this run"
is a real ``run_cancelled`` event applied through ``RunCell.apply_event`` —
the same service, transaction and guards the RPC route uses — followed by
the index bookkeeping the JS client performs after every successful
``applyEvent`` (§6.3 steps 3 and 5):

* the run's ``run:<workflowName>:<ms13 createdAt>:<runId>`` and
  ``runall:<ms13 createdAt>:<runId>`` keys are rewritten with the new status
  (§6.1), so ``runs.list`` reports the run as cancelled;
* every hook the cancellation released loses its global index entries
  (``IndexCell.delete_hook_indexes``, owner-checked), so its token can be
  used by another run.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from worldcell import codec

from .index import IndexCell
from .models import Run
from .runs import RunCell

log = logging.getLogger("cells.operations")

__all__ = ["CancelResult", "INDEX_CELL", "cancel_run", "run_index_entries"]

#: The index cell the client uses for every global index (§4.3).
INDEX_CELL = "index"


@dataclass
class CancelResult:
    """What ``cancel_run`` did to one run.

    Attributes:
        run_id: the run.
        cancelled: True when this call recorded ``run_cancelled``.
        message: for people: why nothing was done (``ENTITY_CONFLICT: Cannot
            transition run from terminal state "completed"``), or a summary.
        event_id: the id of the recorded ``run_cancelled`` event.
        released_hooks: ``[{hookId, token}]`` released by the cancellation.
        index_error: set when the run was cancelled but an index write failed
            afterwards (the run stays cancelled; replaying the event repairs
            the index, §6.3).
    """

    run_id: str
    cancelled: bool
    message: str
    event_id: str | None = None
    released_hooks: list[dict[str, str]] = field(default_factory=list)
    index_error: str | None = None


def run_index_entries(run: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``run:`` and ``runall:`` index entries of a run entity, as the client writes them (§6.1).

    Args:
        run: a run entity as ``applyEvent`` returns it (``runId``,
            ``workflowName``, ``status``, ``createdAt`` datetime).

    Returns ``[(key, value), (key, value)]``: keys embed the 13-digit epoch
    ms of ``createdAt``; the value is the JSON *string*
    ``{"runId":…,"createdAt":"<ISO>","status":…}`` (``JSON.stringify``: compact).
    """
    created = codec.to_utc_ms(run["createdAt"])
    ms13 = str(max(0, codec.epoch_ms(created))).zfill(13)
    meta = json.dumps(
        {"runId": run["runId"], "createdAt": codec.format_iso(created), "status": run["status"]},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return [(f"run:{run['workflowName']}:{ms13}:{run['runId']}", meta), (f"runall:{ms13}:{run['runId']}", meta)]


def cancel_run(run_id: str) -> CancelResult:
    """Cancel one run with a real ``run_cancelled`` event, then fix the index as the client does.

    Args:
        run_id: the run (= run cell name, ``wrun_…``).

    Returns a ``CancelResult``. A run that is already cancelled is left
    alone (upstream would append another ``run_cancelled`` event, quirk Q3);
    a refused event (``ok: false``, e.g. ``ENTITY_CONFLICT`` on a completed
    run, ``LEGACY_RUN_NOT_SUPPORTED``) is reported with its code and message.
    Never raises for a refused cancellation; database errors propagate.
    """
    status = Run.objects.filter(cell__name=run_id).values_list("status", flat=True).first()
    if status is None:
        return CancelResult(run_id, False, "RUN_NOT_FOUND: the run does not exist")
    if status == "cancelled":
        return CancelResult(run_id, False, "already cancelled; nothing to do")

    outcome = RunCell(run_id).apply_event({"runId": run_id, "data": {"eventType": "run_cancelled"}})
    if not outcome.get("ok"):
        return CancelResult(run_id, False, f"{outcome.get('code')}: {outcome.get('message')}")

    released = list(outcome.get("releasedHooks") or [])
    event = outcome.get("event") or {}
    result = CancelResult(
        run_id, True, "cancelled", event_id=event.get("eventId"), released_hooks=released
    )
    index = IndexCell(INDEX_CELL)
    try:
        run = outcome.get("run")
        if run is not None:
            for key, value in run_index_entries(run):
                index.put(key, value)
        for hook in released:
            index.delete_hook_indexes(hook["token"], hook["hookId"], {"runId": run_id, "hookId": hook["hookId"]})
    except Exception as exc:  # noqa: BLE001 - the cancel committed; report the index failure
        log.exception("run %s: cancelled, but updating the index failed", run_id)
        result.index_error = f"{type(exc).__name__}: {exc}"
    return result
