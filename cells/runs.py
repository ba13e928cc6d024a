"""The runs cell service: one workflow run = one cell (docs/protocol.md §4.1, §5).

``RunCell(name)`` serves the seven wire methods of the ``runs`` binding for
the run whose id is ``name``. ``apply_event`` is the only writer: it runs in
one transaction that first locks the cell's ``RunCellState`` row (creating it
when the event may create the run), so calls on one run are serialised while
calls on different runs never wait for each other (docs/architecture.md rule 1). The
state machine lives in ``cells.event_machine``, the SQL in
``cells.run_store`` (``LockedRunCell``: on PostgreSQL two round trips per
event, prepared statements; ``read_*``: one statement per read).

The reads never lock and never create anything: a run that was never written
(or whose id could never be stored) answers ``null`` / an empty page. The
lists follow docs/protocol.md §4.0:
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

from worldcell import clock
from worldcell.sql import is_missing_prepared_statement
from worldcell.errors import ValidationError
from worldcell.keys import fits_utf8, storable_text
from worldcell.tenancy import DEFAULT_TENANT

from . import event_machine, fence
from .event_schemas import ABSENT, ID_MAX_BYTES, check_indexed_size
from .javascript import js_string
from .run_store import LockedRunCell, read_event, read_page, read_run, read_step

__all__ = ["RunCell"]

DEFAULT_LIMITS = {"events": 100, "steps": 20, "hooks": 100}
#: Page sizes above this are clamped (§12 A10, as ``index.list`` does): the
#: ``limit + 1`` peek must stay a valid SQL LIMIT on both databases, and no
#: answer can hold more rows anyway.
FETCH_CAP = 2**31 - 2


class RunCell:
    """The ``runs`` binding's cell for the run ``name`` (the decoded URL segment)."""

    def __init__(self, name: str, tenant: str = DEFAULT_TENANT):
        self.name = name
        self.tenant = tenant

    # ------------------------------------------------------------------ write

    def apply_event(self, request: Any = ABSENT) -> dict[str, Any]:
        """``applyEvent([request])``: apply one event atomically (docs/protocol.md §5).

        Returns the outcome (``{"ok": true, …}`` or a guard failure
        ``{"ok": false, "code", "message"}``). Raises ValidationError (400)
        for invalid input — including a missing ``eventData`` where upstream
        dereferences it and answers 500 ``TypeError`` (§5.8), and ids, names or
        tokens over the caps of ``cells.event_schemas`` (``ID_MAX_BYTES``,
        ``TOKEN_MAX_BYTES``; the run id in the URL too); nothing is written then.

        One transaction: lock the cell row (creating it for events that may
        create the run) and read what the event needs, run the state machine,
        write. On PostgreSQL outside any ``atomic()`` block (every RPC) that is
        two round trips, ``BEGIN`` and ``COMMIT`` included
        (``LockedRunCell``); elsewhere it runs inside ``transaction.atomic()``.
        """
        self._check_writable_name()
        event = event_machine.read_request(self.name, request)
        if LockedRunCell.can_begin_inline():
            for attempt in (1, 2):
                cell = LockedRunCell(self.name, inline=True)
                try:
                    return self._apply(cell, event)
                except BaseException as exc:
                    cell.abort()
                    # a prepared statement vanished (pooler reset): everything was
                    # rolled back and is re-prepared on the next attempt
                    if attempt == 1 and is_missing_prepared_statement(exc):
                        continue
                    raise
        with transaction.atomic():
            return self._apply(LockedRunCell(self.name), event)

    @staticmethod
    def _apply(cell: LockedRunCell, event: event_machine.EventRequest) -> dict[str, Any]:
        event_machine.open_cell(cell, event)
        if cell.expired:  # retention fence: the run has a tombstone (docs/lifecycle.md)
            cell.finish()
            return fence.expired_outcome(cell.name)
        # "now" is read under the lock, so event times follow the log order
        outcome = event_machine.apply_event(cell, event, clock.now())
        cell.finish()
        return outcome

    def _check_writable_name(self) -> None:
        """Raise ValidationError unless the run id can be stored (PostgreSQL text, btree entry size)."""
        if not storable_text(self.name):
            raise ValidationError("run id: U+0000 and unpaired surrogates are not supported")
        check_indexed_size(self.name, "run id", ID_MAX_BYTES)

    # ------------------------------------------------------------------ reads
    # A name or key that could never have been stored (U+0000, unpaired
    # surrogate, longer than the cap) finds nothing, without a query.

    def _readable(self, *keys: str) -> bool:
        return _fits(self.name, ID_MAX_BYTES) and all(storable_text(k) for k in keys)

    def get_run(self) -> dict[str, Any] | None:
        """``getRun([])``: the run entity, or None; raises ``fence.RunExpired`` (410) for an expired run."""
        run = read_run(self.name) if self._readable() else None
        return run if run is not None else self._unless_expired(None)

    def get_step(self, step_id: Any = ABSENT) -> dict[str, Any] | None:
        """``getStep([stepId])``: the step, or None (no argument looks up ``step:undefined``)."""
        step_id = js_string(step_id)
        step = read_step(self.name, step_id) if self._readable(step_id) else None
        return step if step is not None else self._unless_expired(None)

    def get_event(self, event_id: Any = ABSENT) -> dict[str, Any] | None:
        """``getEvent([eventId])``: the event, or None."""
        event_id = js_string(event_id)
        event = read_event(self.name, event_id) if self._readable(event_id) else None
        return event if event is not None else self._unless_expired(None)

    def list_events(self, params: Any = None) -> dict[str, Any]:
        """``listEvents([params?])``: P1 page of events by event id (default limit 100)."""
        return self._page("events", params)

    def list_steps(self, params: Any = None) -> dict[str, Any]:
        """``listSteps([params?])``: P2 page of steps by ``<ISO createdAt>:<stepId>`` (default 20)."""
        return self._page("steps", params)

    def list_hooks(self, params: Any = None) -> dict[str, Any]:
        """``listHooks([params?])``: P2 page of live hooks by ``<ISO createdAt>:<hookId>`` (default 100)."""
        return self._page("hooks", params)

    def _page(self, list_kind: str, params: Any) -> dict[str, Any]:
        """One page ordered by the bytewise key (event id or ``<ISO>:<id>``, §4.0 P1/P2)."""
        limit, cursor, descending = _page_params(params, DEFAULT_LIMITS[list_kind])
        if not self._readable():
            return {"data": [], "cursor": None, "hasMore": False}
        fetched = read_page(list_kind, self.name, cursor, descending, limit + 1)
        if not fetched:
            self._unless_expired(None)
        has_more = len(fetched) > limit
        page = fetched[:limit]
        return {
            "data": [entity for _, entity in page],
            "cursor": page[-1][0] if has_more and page else None,
            "hasMore": has_more,
        }


    def _unless_expired(self, answer: Any) -> Any:
        """``answer`` (an empty read), unless the run expired: then raise ``fence.RunExpired`` (410).

        Reads of an expired cell find nothing (``_CELL_ID`` skips it), so only
        an empty answer costs this lookup.
        """
        if _fits(self.name, ID_MAX_BYTES):
            fence.raise_if_expired(self.name)
        return answer


def _fits(text: str, max_bytes: int) -> bool:
    return storable_text(text) and fits_utf8(text, max_bytes)


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
