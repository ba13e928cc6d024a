"""The runs cell service: one workflow run = one cell (PROTOCOL.md §4.1, §5).

``RunCell(name)`` serves the seven wire methods of the ``runs`` binding for
the run whose id is ``name``. ``apply_event`` is the only writer: it runs in
one transaction that first locks the cell's ``RunCellState`` row (creating it
on first use), so calls on one run are serialised while calls on different
runs never wait for each other (DESIGN.md rule 1). The state machine itself
lives in ``cells.event_machine``.

The reads never lock and never create anything: a run that was never written
answers ``null`` / an empty page. The lists follow PROTOCOL.md §4.0:
``listEvents`` is P1 (keyed by event id), ``listSteps``/``listHooks`` are P2
(keyed by ``<ISO createdAt>:<id>``); each fetches one row more than the
limit to tell ``hasMore``, and the cursor is the key of the last row
returned.

``claimInflight``/``releaseInflight`` (§10.2) are deliberately not
implemented: nothing calls them and they must stay unroutable.
"""
from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Model, QuerySet, Subquery

from worldcell import clock
from worldcell.errors import ValidationError

from . import event_machine
from .event_machine import js_string
from .event_schemas import ABSENT, ID_MAX_BYTES, check_indexed_size, storable_text
from .models.runs import Event, Hook, Run, RunCellState, Step

__all__ = ["RunCell"]

DEFAULT_LIMITS = {"events": 100, "steps": 20, "hooks": 100}
#: Page sizes above this are clamped (§12 A10, as ``index.list`` does): the
#: ``limit + 1`` peek must stay a valid SQL LIMIT on both databases, and no
#: answer can hold more rows anyway.
FETCH_CAP = 2**31 - 2


class RunCell:
    """The ``runs`` binding's cell for the run ``name`` (the decoded URL segment)."""

    def __init__(self, name: str):
        self.name = name

    # ------------------------------------------------------------------ write

    def apply_event(self, request: Any = ABSENT) -> dict[str, Any]:
        """``applyEvent([request])``: apply one event atomically (PROTOCOL.md §5).

        Returns the outcome (``{"ok": true, …}`` or a guard failure
        ``{"ok": false, "code", "message"}``). Raises ValidationError (400)
        for invalid input — including a missing ``eventData`` where upstream
        dereferences it and answers 500 ``TypeError`` (§5.8), and ids, names or
        tokens over the caps of ``cells.event_schemas`` (``ID_MAX_BYTES``,
        ``TOKEN_MAX_BYTES``; the run id in the URL too); nothing is written then.
        """
        with transaction.atomic():
            cell = self._lock_cell()
            # "now" is read under the lock, so event times follow the log order
            return event_machine.apply_event(cell, request, clock.now())

    def _lock_cell(self) -> RunCellState:
        """This cell's row, created if missing, locked until the transaction ends.

        Concurrent first calls both try ``INSERT … ON CONFLICT DO NOTHING``;
        one inserts, the other waits for it and then finds the row, so no
        caller ever sees an IntegrityError. SQLite's IMMEDIATE transactions
        already serialise writers; ``FOR UPDATE`` is a no-op there.
        """
        if not storable_text(self.name):
            raise ValidationError("run id: U+0000 and unpaired surrogates are not supported")
        check_indexed_size(self.name, "run id", ID_MAX_BYTES)
        locked = RunCellState.objects.select_for_update()
        cell = locked.filter(name=self.name).first()
        if cell is None:
            RunCellState.objects.bulk_create([RunCellState(name=self.name)], ignore_conflicts=True)
            cell = locked.get(name=self.name)
        return cell

    # ------------------------------------------------------------------ reads

    def get_run(self) -> dict[str, Any] | None:
        """``getRun([])``: the run entity, or None."""
        if not storable_text(self.name):
            return None
        row = Run.objects.filter(cell__name=self.name).first()
        return None if row is None else row.to_entity(self.name)

    def get_step(self, step_id: Any = ABSENT) -> dict[str, Any] | None:
        """``getStep([stepId])``: the step, or None (no argument looks up ``step:undefined``)."""
        row = self._find(Step, step_id=js_string(step_id))
        return None if row is None else row.to_entity(self.name)

    def get_event(self, event_id: Any = ABSENT) -> dict[str, Any] | None:
        """``getEvent([eventId])``: the event, or None."""
        row = self._find(Event, event_id=js_string(event_id))
        return None if row is None else row.to_entity()

    def list_events(self, params: Any = None) -> dict[str, Any]:
        """``listEvents([params?])``: P1 page of events by event id (default limit 100)."""
        return self._page(Event, "event_id", params, DEFAULT_LIMITS["events"], Event.to_entity)

    def list_steps(self, params: Any = None) -> dict[str, Any]:
        """``listSteps([params?])``: P2 page of steps by ``<ISO createdAt>:<stepId>`` (default 20)."""
        return self._page(Step, "sort_key", params, DEFAULT_LIMITS["steps"], lambda r: r.to_entity(self.name))

    def list_hooks(self, params: Any = None) -> dict[str, Any]:
        """``listHooks([params?])``: P2 page of live hooks by ``<ISO createdAt>:<hookId>`` (default 100)."""
        return self._page(Hook, "sort_key", params, DEFAULT_LIMITS["hooks"], lambda r: r.to_entity(self.name))

    # ------------------------------------------------------------------ helpers

    def _rows(self, model: type[Model]) -> QuerySet:
        """``model`` rows of this run only: ``run_id = (SELECT id … WHERE name = %s)``."""
        cell_id = RunCellState.objects.filter(name=self.name).values("pk")
        return model.objects.filter(run_id=Subquery(cell_id))

    def _find(self, model: type[Model], **key: str) -> Any:
        if not (storable_text(self.name) and all(storable_text(v) for v in key.values())):
            return None  # no stored row can have such a key
        return self._rows(model).filter(**key).first()

    def _page(self, model: type[Model], key: str, params: Any, default_limit: int, render) -> dict[str, Any]:
        """One page of ``model`` rows ordered by the bytewise ``key`` column (§4.0 P1/P2)."""
        limit, cursor, descending = _page_params(params, default_limit)
        if not storable_text(self.name):
            return {"data": [], "cursor": None, "hasMore": False}
        rows = self._rows(model)
        if cursor:
            rows = rows.filter(**{f"{key}__lt" if descending else f"{key}__gt": cursor})
        fetched = list(rows.order_by(f"-{key}" if descending else key)[: limit + 1])
        has_more = len(fetched) > limit
        page = fetched[:limit]
        return {
            "data": [render(row) for row in page],
            "cursor": getattr(page[-1], key) if has_more and page else None,
            "hasMore": has_more,
        }


def _page_params(params: Any, default_limit: int) -> tuple[int, str | None, bool]:
    """``(limit, cursor, descending)`` out of a P1/P2 params object (§4.0, §12 A10).

    ``null``/absent params, limit and cursor take their defaults; ``""`` is
    no cursor; only ``sortOrder: "desc"`` is descending; a limit above
    ``FETCH_CAP`` is clamped to it. Raises ValidationError for a limit that
    is not a non-negative integer and a cursor that is not a string.
    """
    if params is None or params is ABSENT:
        params = {}
    if not isinstance(params, dict):
        raise ValidationError("params: expected object")
    limit = params.get("limit")
    if limit is None:
        limit = default_limit
    elif isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValidationError(f"params.limit: expected a non-negative integer, received {limit!r}"[:200])
    cursor = params.get("cursor")
    if cursor is not None:
        if not isinstance(cursor, str):
            raise ValidationError("params.cursor: expected string")
        if not storable_text(cursor):
            raise ValidationError("params.cursor: U+0000 and unpaired surrogates are not supported")
    return min(limit, FETCH_CAP), cursor or None, params.get("sortOrder") == "desc"
