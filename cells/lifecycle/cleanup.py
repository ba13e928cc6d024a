"""Paged deletion: the cleanup phases of expired runs, resumable at any line (docs/lifecycle.md §4–§5).

``clean_runs`` deletes an expired run's data in pages of at most ``PAGE``
rows (runs in the same phase together), one short transaction per page that
also records the progress on the tombstones, with a pause between pages
(``WORLDCELL_RETENTION_DUTY``, ``_Budget``), phase by phase
(``CLEANUP_PHASES``): hooks (and their index entries), events (and their
``correlation:`` keys), steps, stream chunks and registry, queue messages and
dead letters, the run row, then a ``settle`` phase that repeats the
listing-key and queue deletions once ``settle_ms`` have passed (for writes
that were already in flight when the tombstone was written). Every phase
deletes "what is left", so a crash at any line resumes where it stopped and
no step is ever done twice with a different result.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from worldcell import clock, codec
from worldcell import sql as wsql
from worldcell.tenancy import DEFAULT_TENANT

from ..models import (
    Event,
    Hook,
    HookMarker,
    Run,
    RunCellState,
    RunTombstone,
    Step,
    Stream,
    StreamChunk,
    StreamRegistration,
)
from ..models.tombstone import CLEANUP_PHASES, FlowMessageRecord, RunRepair
from . import store
from .policies import settle_ms
from .store import (
    _IDX,
    INDEX_CELL,
    _add_tallies,
    _marks,
    _rowcount,
    _rows,
    correlation_key,
    delete_index_keys_by_run,
    listing_keys,
)

__all__ = ["PAGE", "PAGES_PER_TICK", "clean_run", "clean_runs", "duty_cycle"]

#: Rows deleted per statement and transaction (docs/lifecycle.md "Bounded work").
PAGE = 500
#: Pages one sweep tick may spend in total before it leaves the rest to the next tick.
PAGES_PER_TICK = 4_000


class _Budget:
    """Pages a sweep tick may still spend, and the sweep's duty cycle (docs/lifecycle.md §5).

    ``duty`` (0 < duty ≤ 1, ``WORLDCELL_RETENTION_DUTY``): the share of wall
    time the sweep may work. Before each page it pauses for
    ``worked × (1/duty − 1)`` (at most 1 s), ``worked`` being the time since
    the previous page began: at 0.5 it rests as long as it worked, so the
    fleet's own requests keep most of the CPU and the database.
    """

    def __init__(self, pages: int, duty: float | None = None):
        self.left = pages
        self.duty = duty_cycle() if duty is None else duty
        self._mark = time.monotonic()

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        if self.duty < 1:
            worked = time.monotonic() - self._mark
            time.sleep(min(1.0, worked * (1 / self.duty - 1)))
            self._mark = time.monotonic()
        return True


def duty_cycle() -> float:
    """``WORLDCELL_RETENTION_DUTY``: the share of wall time a sweep may work (default 0.5)."""
    return float(getattr(settings, "WORLDCELL_RETENTION_DUTY", 0.5))


def _count(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """``{run: {kind: n}}`` out of ``(run, kind)`` pairs."""
    out: dict[str, dict[str, int]] = {}
    for run_id, kind in pairs:
        kinds = out.setdefault(run_id, {})
        kinds[kind] = kinds.get(kind, 0) + 1
    return out


_EV = wsql.table(Event)
_HK = wsql.table(Hook)
_MK = wsql.table(HookMarker)
_ST = wsql.table(Step)
_RN = wsql.table(Run)
_STREAM = wsql.table(Stream)
_CHUNK = wsql.table(StreamChunk)
_REG = wsql.table(StreamRegistration)


@dataclass
class _Group:
    """Runs in the same cleanup phase, cleaned together: ``cells`` maps cell id -> run id."""

    cells: dict[int, str]

    @property
    def ids(self) -> list[int]:
        return sorted(self.cells)

    @property
    def runs(self) -> list[str]:
        return sorted(self.cells.values())

    def next_phase(self, phase: str) -> dict[str, str]:
        following = CLEANUP_PHASES[CLEANUP_PHASES.index(phase) + 1]
        return {run_id: following for run_id in self.cells.values()}


def _paged_rows(table: str, select: str, run_column: str, keys: list[Any], tenant: str | None = None) -> list[tuple]:
    """Up to ``PAGE`` rows of ``table`` whose ``run_column`` is one of ``keys``: ``(id, …select)``.

    ``tenant``: for a table keyed by tenant (``worldcell.tenancy``), that tenant's rows only.

    No ORDER BY: any page will do (each is deleted before the next is read),
    and an order on ``id`` would tempt the planner into walking the primary
    key past every other run's rows instead of using the run's index.
    """
    scope, params = ('"tenant" = %s AND ', [tenant]) if tenant is not None else ("", [])
    return _rows(
        f'SELECT "id", {select} FROM "{table}" WHERE {scope}"{run_column}" IN ({_marks(keys)}) LIMIT %s',
        [*params, *keys, PAGE],
    )


def _phase_hooks(group: _Group, budget: _Budget, now: datetime) -> bool:
    """Live hooks: their ``hook:``/``hookid:``/``hookclaim:`` index entries, then the rows; then the markers."""
    from ..index import IndexCell

    index = IndexCell(INDEX_CELL)
    while budget.take():
        hooks = _paged_rows(_HK, '"run_id", "hook_id", "token"', "run_id", group.ids)
        for _, cell_id, hook_id, token in hooks:  # each its own short transaction under the token's lock (§6.3)
            index.delete_hook_indexes(token, hook_id, {"runId": group.cells[cell_id], "hookId": hook_id})
        with transaction.atomic():
            _delete_ids(_HK, [h[0] for h in hooks])
            markers = [] if len(hooks) >= PAGE else _paged_rows(_MK, '"run_id"', "run_id", group.ids)
            _delete_ids(_MK, [m[0] for m in markers])
            done = len(hooks) < PAGE and len(markers) < PAGE
            tallies = _count([(group.cells[h[1]], "hooks") for h in hooks] +
                             [(group.cells[m[1]], "hook_markers") for m in markers])
            _add_tallies(tallies, group.next_phase("hooks") if done else {})
        if done:
            return True
    return False


def _delete_ids(table: str, ids: list[int]) -> int:
    if not ids:
        return 0
    return _rowcount(f'DELETE FROM "{table}" WHERE "id" IN ({_marks(ids)})', ids)


def _phase_events(group: _Group, budget: _Budget, now: datetime) -> bool:
    """Events in pages, each page with the ``correlation:`` index keys of its events."""
    while budget.take():
        with transaction.atomic():
            rows = _paged_rows(_EV, '"run_id", "event_id", "correlation_id", "created_at"', "run_id", group.ids)
            keys = [correlation_key(c, codec.to_utc_ms(t), e, group.cells[r]) for _, r, e, c, t in rows
                    if c is not None]
            found = _rows(f'SELECT "key" FROM "{_IDX}" WHERE "cell" = %s AND "key" IN ({_marks(keys)})',
                          [INDEX_CELL, *keys]) if keys else []
            store.delete_index_keys([k for (k,) in found])
            _delete_ids(_EV, [r[0] for r in rows])
            done = len(rows) < PAGE
            tallies = _count([(group.cells[r[1]], "events") for r in rows] +
                             [(k.rsplit(":", 1)[-1], "index") for (k,) in found])
            _add_tallies(tallies, group.next_phase("events") if done else {})
        if done:
            return True
    return False


def _phase_steps(group: _Group, budget: _Budget, now: datetime) -> bool:
    while budget.take():
        with transaction.atomic():
            rows = _paged_rows(_ST, '"run_id"', "run_id", group.ids)
            _delete_ids(_ST, [r[0] for r in rows])
            done = len(rows) < PAGE
            _add_tallies(_count((group.cells[r[1]], "steps") for r in rows), group.next_phase("steps") if done else {})
        if done:
            return True
    return False


def _phase_streams(group: _Group, budget: _Budget, now: datetime) -> bool:
    """Each registered stream: its chunks in pages, then the stream is closed (kept as a fence); then the registry."""
    registries = {f"run-streams:{run_id}": run_id for run_id in group.cells.values()}
    while budget.take():
        regs = _paged_rows(_REG, '"cell", "name"', "cell", sorted(registries), tenant=DEFAULT_TENANT)
        if not regs:
            with transaction.atomic():
                _add_tallies({}, group.next_phase("streams"))
            return True
        for reg_id, registry, name in regs:
            run_id = registries[registry]
            stream = _rows(f'SELECT "id" FROM "{_STREAM}" WHERE "tenant" = %s AND "name" = %s',
                           [DEFAULT_TENANT, f"stream:{name}"])
            if stream:
                stream_id = stream[0][0]
                while True:
                    if not budget.take():
                        return False
                    with transaction.atomic():
                        n = _rowcount(
                            f'DELETE FROM "{_CHUNK}" WHERE "id" IN '
                            f'(SELECT "id" FROM "{_CHUNK}" WHERE "stream_id" = %s LIMIT %s)',
                            [stream_id, PAGE],
                        )
                        _add_tallies({run_id: {"stream_chunks": n}}, {})
                    if n < PAGE:
                        break
                # a closed stream refuses late writes ("Cannot write to a closed stream")
                _rowcount(f'UPDATE "{_STREAM}" SET "closed" = %s WHERE "id" = %s', [True, stream_id])
            with transaction.atomic():
                _delete_ids(_REG, [reg_id])
                _add_tallies({run_id: {"streams": 1}}, {})
    return False


def _delete_queue_rows(run_ids: list[str], budget: _Budget) -> tuple[dict[str, dict[str, int]], bool]:
    """Delete the runs' queue messages and dead letters, each page under its queue cell's lock.

    Returns ``({run: {"messages"|"dead_letters": n}}, finished)``.
    """
    from queueing.models import DeadLetter, Message, QueueCell

    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    tallies: dict[str, dict[str, int]] = {}
    for kind, model in (("messages", Message), ("dead_letters", DeadLetter)):
        table = wsql.table(model)
        while True:
            rows = _paged_rows(table, '"cell_id", "run_id"', "run_id", run_ids)
            if not rows:
                break
            if not budget.take():
                return tallies, False
            by_cell: dict[int, list[tuple[int, str]]] = {}
            for pk, cell_id, run_id in rows:
                by_cell.setdefault(cell_id, []).append((pk, run_id))
            for cell_id, items in sorted(by_cell.items()):
                with transaction.atomic():
                    _rows(f'SELECT "id" FROM "{wsql.table(QueueCell)}" WHERE "id" = %s{lock}', [cell_id])
                    _delete_ids(table, [pk for pk, _ in items])
                for _, run_id in items:
                    kinds = tallies.setdefault(run_id, {})
                    kinds[kind] = kinds.get(kind, 0) + 1
            if len(rows) < PAGE:
                break
    return tallies, True


def _phase_queue(group: _Group, budget: _Budget, now: datetime) -> bool:
    tallies, done = _delete_queue_rows(group.runs, budget)
    with transaction.atomic():
        _add_tallies(tallies, group.next_phase("queue") if done else {})
    return done


def _phase_run(group: _Group, budget: _Budget, now: datetime) -> bool:
    """The run rows (their payloads: input, output, error, executionContext) and the repair records."""
    if not budget.take():
        return False
    with transaction.atomic():
        gone = _rows(f'SELECT "cell_id" FROM "{_RN}" WHERE "cell_id" IN ({_marks(group.ids)})', group.ids)
        _rowcount(f'DELETE FROM "{_RN}" WHERE "cell_id" IN ({_marks(group.ids)})', group.ids)
        FlowMessageRecord.objects.filter(run_id__in=group.runs).delete()
        RunRepair.objects.filter(run_id__in=group.runs).delete()
        _add_tallies({group.cells[c]: {"runs": 1} for (c,) in gone}, group.next_phase("run"))
    return True


def _phase_settle(group: _Group, budget: _Budget, now: datetime) -> bool:
    """Once ``settle_ms`` have passed since the tombstone: repeat the listing-key and queue deletions, finish."""
    settled = now - timedelta(milliseconds=settle_ms())
    tombs = list(RunTombstone.objects.filter(run_id__in=group.runs, tombstoned_at__lte=settled)
                 .values("run_id", "workflow_name", "created_at"))
    if not tombs:
        return False
    run_ids = [t["run_id"] for t in tombs]
    tallies, done = _delete_queue_rows(run_ids, budget)
    if not done or not budget.take():
        return False
    with transaction.atomic():
        keys = [k for t in tombs for k in listing_keys(t["run_id"], t["workflow_name"], codec.to_utc_ms(t["created_at"]))]
        for run_id, n in delete_index_keys_by_run(keys).items():
            tallies.setdefault(run_id, {})["index"] = n
        _add_tallies(tallies, {run_id: "done" for run_id in run_ids})
        RunTombstone.objects.filter(run_id__in=run_ids).update(cleaned_at=clock.now())
    return len(run_ids) == len(group.cells)


_PHASES = {
    "hooks": _phase_hooks,
    "events": _phase_events,
    "steps": _phase_steps,
    "streams": _phase_streams,
    "queue": _phase_queue,
    "run": _phase_run,
    "settle": _phase_settle,
}


def clean_runs(run_ids: list[str], now: datetime | None = None, *, pages: int = PAGES_PER_TICK) -> tuple[int, int]:
    """Continue the cleanup of expired runs from their tombstones' phases; ``(finished, left)``.

    Runs in the same phase are cleaned together, page by page (at most
    ``PAGE`` rows per statement and transaction, ``pages`` pages in all);
    each page records its progress on the tombstones in its own
    transaction, so a crash resumes at the first uncommitted page (docs/lifecycle.md §4).
    Raises what a page raises, after recording it on the tombstones
    (``last_error``); what committed before stays done.
    """
    now = now or clock.now()
    if not run_ids:
        return 0, 0
    tombs = dict(RunTombstone.objects.filter(run_id__in=run_ids).exclude(phase="done").values_list("run_id", "phase"))
    cells = dict(RunCellState.objects.filter(name__in=list(tombs)).values_list("name", "pk"))
    if not tombs:
        return 0, 0
    RunTombstone.objects.filter(run_id__in=list(tombs)).update(attempts=F("attempts") + 1)
    budget = _Budget(pages)
    try:
        for phase in CLEANUP_PHASES[:-1]:
            members = {cells[r]: r for r, p in tombs.items() if p == phase and r in cells}
            if not members:
                continue
            if _PHASES[phase](_Group(members), budget, now):
                following = CLEANUP_PHASES[CLEANUP_PHASES.index(phase) + 1]
                for run_id in members.values():
                    tombs[run_id] = following
    except Exception as exc:
        RunTombstone.objects.filter(run_id__in=list(tombs)).exclude(phase="done").update(
            last_error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    finished = RunTombstone.objects.filter(run_id__in=list(tombs), phase="done").count()
    return finished, len(tombs) - finished


def clean_run(run_id: str, now: datetime | None = None, *, pages: int = PAGES_PER_TICK) -> bool:
    """``clean_runs([run_id])``: True when the run's cleanup is finished."""
    clean_runs([run_id], now, pages=pages)
    return RunTombstone.objects.filter(run_id=run_id, phase="done").exists()
