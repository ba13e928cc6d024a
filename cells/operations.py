"""Operator actions on runs, done the way the world-celld client would do them (docs/protocol.md §5, §6.3).

The admin never edits event-sourced rows. An operator's "cancel this run"
is a real ``run_cancelled`` event applied through ``RunCell.apply_event`` —
the same service, transaction and guards the RPC route uses — followed by
the index writes the JS client makes after every successful ``applyEvent``
(``worldcell_client.index_calls_after_apply_event``, the one definition the
Python client uses too), invoked in-process on the index cell through the
dispatch table: the run's ``run:`` and ``runall:`` keys get the new status
(so ``runs.list`` reports the run as cancelled) and every hook the
cancellation released loses its global index entries (owner-checked), so
its token can be used by another run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from worldcell import dispatch
from worldcell_client import INDEX_CELL, index_calls_after_apply_event

from .models import Run
from .runs import RunCell

log = logging.getLogger("cells.operations")

__all__ = ["CancelResult", "apply_as_client", "cancel_run", "write_client_index"]


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

    outcome, index_error = apply_as_client(run_id, {"runId": run_id, "data": {"eventType": "run_cancelled"}})
    if not outcome.get("ok"):
        return CancelResult(run_id, False, f"{outcome.get('code')}: {outcome.get('message')}")

    released = list(outcome.get("releasedHooks") or [])
    event = outcome.get("event") or {}
    return CancelResult(
        run_id, True, "cancelled", event_id=event.get("eventId"), released_hooks=released, index_error=index_error
    )


def apply_as_client(run_id: str, request: dict) -> tuple[dict, str | None]:
    """``applyEvent(request)`` on run cell ``run_id``, then the client's index writes; ``(outcome, index error)``.

    The one way the console writes an event: ``RunCell.apply_event`` (the
    event state machine, its transaction and guards), then — when the
    outcome is ``ok`` — ``write_client_index``. A caller that applies the
    event inside its own ``atomic`` block calls ``RunCell.apply_event`` there
    and ``write_client_index`` after its commit instead.

    Returns the outcome and None, or the text of an index failure. Raises
    ValidationError for an invalid request; database errors propagate.
    """
    outcome = RunCell(run_id).apply_event(request)
    if not outcome.get("ok"):
        return outcome, None
    return outcome, write_client_index(run_id, outcome)


def write_client_index(run_id: str, outcome: dict) -> str | None:
    """The index calls the JS client makes after an ``ok`` ``applyEvent`` outcome (§6.3); None or the failure.

    In-process through the dispatch table (``index_calls_after_apply_event``,
    the one definition). A failure is logged and returned as text, never
    raised: the event stays committed and replaying it repairs the index.
    """
    try:
        for method, args in index_calls_after_apply_event(run_id, outcome):
            dispatch.invoke(dispatch.lookup("index", method), INDEX_CELL, method, list(args))
    except Exception as exc:  # noqa: BLE001 - the event committed; report the index failure
        log.exception("run %s: event applied, but updating the index failed", run_id)
        return f"{type(exc).__name__}: {exc}"
    return None
