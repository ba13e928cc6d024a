"""Run retention: tombstones, bounded resumable cleanup sweeps, and the guards (docs/lifecycle.md).

Policy (``Policy``): terminal runs expire ``WORLDCELL_RUN_RETENTION`` after
they completed/failed/were cancelled; every run expires ``WORLDCELL_MAX_RUN_AGE``
after it was created; when both apply the earlier deadline wins; both are
off by default (docs/lifecycle.md "Policies").

Expiry of a batch of runs (``expire_runs``), in ONE short transaction under
the run cells' row locks: write each one's ``RunTombstone`` (phase ``hooks``),
set ``RunCellState.expired`` and delete its two listing keys (``run:`` and
``runall:``). From that commit on every read of the run answers
``RunExpiredError`` (HTTP 410), every ``applyEvent`` the ``RUN_EXPIRED``
outcome, listings no longer see it — whatever of its data is still there.
Then ``clean_runs`` deletes the data in pages of at most ``PAGE`` rows (runs
in the same phase together), one short transaction per page that also
records the progress on the tombstones, with a pause between pages
(``WORLDCELL_RETENTION_DUTY``),
phase by phase (``CLEANUP_PHASES``): hooks (and their index entries), events
(and their ``correlation:`` keys), steps, stream chunks and registry, queue
messages and dead letters, the run row, then a ``settle`` phase that repeats
the listing-key and queue deletions once ``SETTLE_MS`` have passed (for
writes that were already in flight when the tombstone was written). Every
phase deletes "what is left", so a crash at any line resumes where it
stopped and no step is ever done twice with a different result.

Guards (``RunExpired``, ``expired_outcome``, ``raise_if_expired``,
``put_index_unless_expired``, ``refuse_enqueue``) are called from the cell
services at single, delimited hook points.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable
from urllib.parse import quote

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from queueing.runref import run_of_message  # noqa: F401 - re-exported
from worldcell import clock, codec
from worldcell import metrics
from worldcell import sql as wsql

from .fence import (  # noqa: F401 - re-exported: the guards live in cells.fence
    RunExpired,
    expired_at_of,
    expired_message,
    expired_outcome,
    is_expired,
    put_index_unless_expired,
    raise_if_expired,
    refuse_enqueue,
    run_of_index_key,
)
from .models import (
    Event,
    Hook,
    HookMarker,
    IndexEntry,
    LifecycleState,
    Run,
    RunCellState,
    RunTombstone,
    Step,
    Stream,
    StreamChunk,
    StreamRegistration,
)
from .event_machine import TERMINAL_RUN
from .models.tombstone import CLEANUP_PHASES, FlowMessageRecord, RunRepair

log = logging.getLogger("cells.lifecycle")

__all__ = [
    "PAGE",
    "Policy",
    "RunExpired",
    "SweepReport",
    "clean_run",
    "clean_runs",
    "expire_run",
    "expire_runs",
    "expired_outcome",
    "is_expired",
    "policy",
    "put_index_unless_expired",
    "raise_if_expired",
    "refuse_enqueue",
    "run_of_index_key",
    "run_of_message",
    "status",
    "sweep",
]

TERMINAL_STATUSES = tuple(sorted(TERMINAL_RUN))  # as SQL parameters, in a fixed order
#: Rows deleted per statement and transaction (docs/lifecycle.md "Bounded work").
PAGE = 500
#: Pages one sweep tick may spend in total before it leaves the rest to the next tick.
PAGES_PER_TICK = 4_000
#: The index cell the reference client writes its listing/correlation/hook keys to.
INDEX_CELL = "index"
#: Seconds a sweep holds its lease (another sweep meanwhile does nothing).
LEASE_S = 300


def settle_ms() -> int:
    """Milliseconds between a run's tombstone and its final ``settle`` pass (default 60 000).

    Longer than any single RPC already in flight when the tombstone was written
    needs to land (the client's index puts follow its applyEvent at once).
    """
    return int(getattr(settings, "WORLDCELL_RETENTION_SETTLE_MS", 60_000))


# =========================================================================== policy


@dataclass(frozen=True)
class Policy:
    """The retention settings (docs/lifecycle.md "Policies"); durations in ms, None = off."""

    retention_ms: int | None
    max_age_ms: int | None
    batch: int

    @property
    def enabled(self) -> bool:
        return self.retention_ms is not None or self.max_age_ms is not None

    def deadline(self, status: str, created_at: datetime, completed_at: datetime | None) -> tuple[datetime, str] | None:
        """``(expires_at, reason)`` of a run by this policy, or None when no policy applies.

        ``reason`` is ``terminal-retention`` or ``maximum-age``; the earlier deadline wins.
        """
        found: list[tuple[datetime, str]] = []
        if self.retention_ms is not None and status in TERMINAL_STATUSES and completed_at is not None:
            found.append((completed_at + timedelta(milliseconds=self.retention_ms), "terminal-retention"))
        if self.max_age_ms is not None:
            found.append((created_at + timedelta(milliseconds=self.max_age_ms), "maximum-age"))
        return min(found, key=lambda f: f[0]) if found else None


def policy() -> Policy:
    """The policy from the settings (``WORLDCELL_RUN_RETENTION``, ``WORLDCELL_MAX_RUN_AGE``, batch)."""
    return Policy(
        retention_ms=getattr(settings, "WORLDCELL_RUN_RETENTION_MS", None),
        max_age_ms=getattr(settings, "WORLDCELL_MAX_RUN_AGE_MS", None),
        batch=min(1000, max(1, int(getattr(settings, "WORLDCELL_RETENTION_BATCH", 128)))),
    )


def _rows(statement: str, params: Iterable[Any]) -> list[tuple]:
    """The rows of one statement (``worldcell.sql.rows``: Django's cursor, not prepared)."""
    return wsql.rows(wsql.database(), statement, list(params))


def _rowcount(statement: str, params: Iterable[Any]) -> int:
    return wsql.rowcount(wsql.database(), statement, list(params))


_T = wsql.table(RunTombstone)
_CELL = wsql.table(RunCellState)
_IDX = wsql.table(IndexEntry)


# =========================================================================== expiry


def _ms13(value: datetime) -> str:
    return str(max(0, codec.epoch_ms(value))).zfill(13)


def listing_keys(run_id: str, workflow_name: str, created_at: datetime) -> list[str]:
    """The client's two listing keys of a run (``run:<wf>:<ms13>:<id>``, ``runall:<ms13>:<id>``)."""
    ms = _ms13(created_at)
    return [f"run:{workflow_name}:{ms}:{run_id}", f"runall:{ms}:{run_id}"]


def correlation_key(correlation_id: str, created_at: datetime, event_id: str, run_id: str) -> str:
    """The client's correlation index key of one event (``encodeURIComponent`` of the id)."""
    encoded = quote(correlation_id, safe="-_.!~*'()")
    return f"correlation:{encoded}:{_ms13(created_at)}:{event_id}:{run_id}"


def _marks(values: list[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def _db_time(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def expire_runs(run_ids: list[str], now: datetime | None = None, *, reason: str | None = None,
                pol: Policy | None = None) -> list[str]:
    """Write the tombstones of those ``run_ids`` that are due and fence them: ONE transaction.

    Under the run cells' row locks (taken in cell id order, so two sweeps
    never deadlock; ``FOR UPDATE`` on PostgreSQL, SQLite's IMMEDIATE
    transaction excludes every other writer): re-read each run, recompute
    its deadline, insert its ``RunTombstone`` (phase ``hooks``), set
    ``RunCellState.expired`` and delete its ``run:``/``runall:`` listing keys
    (docs/lifecycle.md §2). A batch of runs is one short transaction: a few
    statements whatever its size (at most ``batch`` ≤ 1000 runs).

    Args:
        run_ids: run ids (= run cell names).
        now: the sweep's time (default: the clock).
        reason: ``manual`` expires regardless of the policy; None = only runs
            whose policy deadline (re-read under the lock) has passed.
        pol: the policy (default: ``policy()``).

    Returns the run ids this call expired (already expired, missing and not
    yet due runs are skipped).
    """
    now = now or clock.now()
    pol = pol or policy()
    if not run_ids:
        return []
    lock = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    with transaction.atomic():
        cells = _rows(
            f'SELECT "id", "name" FROM "{_CELL}" WHERE "name" IN ({_marks(run_ids)}) AND NOT "expired" '
            f'ORDER BY "id"{lock}',
            run_ids,
        )
        if not cells:
            return []
        names = {pk: name for pk, name in cells}
        runs = Run.objects.filter(cell_id__in=list(names)).values(
            "cell_id", "status", "workflow_name", "deployment_id", "created_at", "started_at", "completed_at",
            "updated_at",
        )
        tombs, keys, fenced = [], [], []
        for run in runs:
            run_id = names[run["cell_id"]]
            if reason == "manual":
                expires_at, why = now, "manual"
            else:
                due = pol.deadline(run["status"], run["created_at"], run["completed_at"])
                if due is None or due[0] > now:
                    continue
                expires_at, why = due
            run_keys = listing_keys(run_id, run["workflow_name"], run["created_at"])
            keys += run_keys
            fenced.append(run["cell_id"])
            tombs.append(RunTombstone(
                run_id=run_id, workflow_name=run["workflow_name"], deployment_id=run["deployment_id"],
                status=run["status"], created_at=run["created_at"], started_at=run["started_at"],
                completed_at=run["completed_at"], updated_at=run["updated_at"], expired_at=expires_at,
                tombstoned_at=now, reason=why, phase=CLEANUP_PHASES[0], deleted={},
            ))
        if not tombs:
            return []
        RunTombstone.objects.bulk_create(tombs)
        _rowcount(f'UPDATE "{_CELL}" SET "expired" = %s WHERE "id" IN ({_marks(fenced)})', [True, *fenced])
        deleted = _delete_index_keys_by_run(keys)
        _add_tallies({t.run_id: {"index": deleted.get(t.run_id, 0)} for t in tombs}, {})
    return [t.run_id for t in tombs]


def expire_run(run_id: str, now: datetime | None = None, *, reason: str | None = None, pol: Policy | None = None) -> bool:
    """``expire_runs([run_id], …)``: True when this call expired the run."""
    return bool(expire_runs([run_id], now, reason=reason, pol=pol))


def _delete_index_keys(keys: list[str]) -> int:
    """Delete those of ``keys`` that exist in the index cell; how many went."""
    if not keys:
        return 0
    return _rowcount(f'DELETE FROM "{_IDX}" WHERE "cell" = %s AND "key" IN ({_marks(keys)})', [INDEX_CELL, *keys])


def _delete_index_keys_by_run(keys: list[str]) -> dict[str, int]:
    """Delete run-scoped ``keys`` (their run is the last ``:`` segment); ``{run id: keys deleted}``."""
    if not keys:
        return {}
    found = _rows(f'SELECT "key" FROM "{_IDX}" WHERE "cell" = %s AND "key" IN ({_marks(keys)})', [INDEX_CELL, *keys])
    _delete_index_keys([k for (k,) in found])
    out: dict[str, int] = {}
    for (key,) in found:
        run_id = key.rsplit(":", 1)[-1]
        out[run_id] = out.get(run_id, 0) + 1
    return out


# =========================================================================== cleanup


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


_TOMB_LOCK = 'SELECT "id", "run_id", "deleted", "phase" FROM "{t}" WHERE "run_id" IN ({marks}) ORDER BY "id"{lock}'


def _add_tallies(tallies: dict[str, dict[str, int]], phases: dict[str, str]) -> None:
    """Add ``{run: {kind: n}}`` to the tombstones' ``deleted`` and set ``{run: phase}`` (caller's transaction).

    The tombstone rows are locked (PostgreSQL) and written with one
    parameterised UPDATE per row sent as one ``executemany``.
    """
    run_ids = sorted(set(tallies) | set(phases))
    if not run_ids:
        return
    postgres = connection.vendor == "postgresql"
    rows = _rows(_TOMB_LOCK.format(t=_T, marks=_marks(run_ids), lock=" FOR UPDATE" if postgres else ""), run_ids)
    updates = []
    for pk, run_id, deleted, phase in rows:
        deleted = dict(json.loads(deleted) if isinstance(deleted, (str, bytes)) else deleted or {})
        for kind, n in tallies.get(run_id, {}).items():
            if n:
                deleted[kind] = deleted.get(kind, 0) + n
        updates.append([json.dumps(deleted, sort_keys=True), phases.get(run_id, phase), pk])
    value = "CAST(%s AS jsonb)" if postgres else "%s"
    with connection.cursor() as cur:
        cur.executemany(f'UPDATE "{_T}" SET "deleted" = {value}, "phase" = %s WHERE "id" = %s', updates)


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


def _paged_rows(table: str, select: str, run_column: str, keys: list[Any]) -> list[tuple]:
    """Up to ``PAGE`` rows of ``table`` whose ``run_column`` is one of ``keys``: ``(id, …select)``.

    No ORDER BY: any page will do (each is deleted before the next is read),
    and an order on ``id`` would tempt the planner into walking the primary
    key past every other run's rows instead of using the run's index.
    """
    return _rows(
        f'SELECT "id", {select} FROM "{table}" WHERE "{run_column}" IN ({_marks(keys)}) LIMIT %s',
        [*keys, PAGE],
    )


def _phase_hooks(group: _Group, budget: _Budget, now: datetime) -> bool:
    """Live hooks: their ``hook:``/``hookid:``/``hookclaim:`` index entries, then the rows; then the markers."""
    from .index import IndexCell

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
            _delete_index_keys([k for (k,) in found])
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
        regs = _paged_rows(_REG, '"cell", "name"', "cell", sorted(registries))
        if not regs:
            with transaction.atomic():
                _add_tallies({}, group.next_phase("streams"))
            return True
        for reg_id, registry, name in regs:
            run_id = registries[registry]
            stream = _rows(f'SELECT "id" FROM "{_STREAM}" WHERE "name" = %s', [f"stream:{name}"])
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
        for run_id, n in _delete_index_keys_by_run(keys).items():
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


# =========================================================================== the sweep


@dataclass
class SweepReport:
    """What one sweep did (``sweep``); times in epoch ms, ``rate`` in runs/s."""

    started_at: int
    finished_at: int = 0
    enabled: bool = True
    busy: bool = False
    dry_run: bool = False
    expired: int = 0
    cleaned: int = 0
    resumed: int = 0
    waiting: int = 0
    stragglers: int = 0
    failed: int = 0
    more: bool = False
    candidates: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        seconds = max(0.001, (self.finished_at - self.started_at) / 1000)
        return round(self.expired / seconds, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "startedAt": self.started_at, "finishedAt": self.finished_at, "enabled": self.enabled,
            "busy": self.busy, "dryRun": self.dry_run, "expired": self.expired, "cleaned": self.cleaned,
            "resumed": self.resumed, "waiting": self.waiting, "stragglers": self.stragglers,
            "failed": self.failed, "more": self.more, "rate": self.rate,
        }


def due_runs(now: datetime, limit: int, pol: Policy | None = None) -> list[dict[str, Any]]:
    """Up to ``limit`` runs whose deadline has passed, not yet expired: ``{runId, status, expiresAt, reason}``.

    Two index range scans (``completed_at`` for terminal retention,
    ``created_at`` for the maximum age); each candidate's deadline is
    recomputed under its lock by ``expire_runs``.
    """
    pol = pol or policy()
    found: dict[str, dict[str, Any]] = {}
    select = (
        f'SELECT c."name", r."status", r."created_at", r."completed_at" FROM "{_RN}" r '
        f'JOIN "{_CELL}" c ON c."id" = r."cell_id" WHERE NOT c."expired" AND '
    )
    queries = []
    if pol.retention_ms is not None:
        cutoff = _db_time(now - timedelta(milliseconds=pol.retention_ms))
        queries.append((select + 'r."completed_at" <= %s AND r."status" IN (%s, %s, %s) ORDER BY r."completed_at" LIMIT %s',
                        [cutoff, *TERMINAL_STATUSES, limit]))
    if pol.max_age_ms is not None:
        cutoff = _db_time(now - timedelta(milliseconds=pol.max_age_ms))
        queries.append((select + 'r."created_at" <= %s ORDER BY r."created_at" LIMIT %s', [cutoff, limit]))
    for sql, params in queries:
        for name, status_, created, completed in _rows(sql, params):
            due = pol.deadline(status_, codec.to_utc_ms(created), codec.to_utc_ms(completed) if completed else None)
            if due is None or due[0] > now:
                continue
            prev = found.get(name)
            if prev is None or due[0] < prev["expiresAt"]:
                found[name] = {"runId": name, "status": status_, "expiresAt": due[0], "reason": due[1]}
    return sorted(found.values(), key=lambda r: r["expiresAt"])[:limit]


def _take_lease(kind: str, now_ms: int) -> bool:
    LifecycleState.objects.get_or_create(kind=kind)
    return bool(
        _rowcount(
            f'UPDATE "{wsql.table(LifecycleState)}" SET "last_started_at" = %s '
            'WHERE "kind" = %s AND ("last_started_at" IS NULL OR "last_finished_at" >= "last_started_at" '
            'OR "last_started_at" < %s)',
            [now_ms, kind, now_ms - LEASE_S * 1000],
        )
    )


def _finish(kind: str, report: dict[str, Any], now_ms: int) -> None:
    LifecycleState.objects.filter(kind=kind).update(last_finished_at=now_ms, last_result=report)


def sweep(now: datetime | None = None, *, batch: int | None = None, dry_run: bool = False) -> SweepReport:
    """One retention sweep tick (beat, the dev fleet's ticker, ``manage.py retention --now``).

    Order: continue up to ``batch`` unfinished cleanups (oldest tombstone
    first; a run waiting for its settle pass takes no slot), then expire
    the due runs that fill the rest of ``batch`` (one fence transaction for
    all of them) and clean them, then delete up to ``PAGE`` queue messages/
    dead letters that arrived for already-expired runs. Bounded: at most
    ``batch`` (≤ 1000) runs and ``PAGES_PER_TICK`` pages of ≤ ``PAGE`` rows.
    ``report.more`` says a full batch was found (the caller may tick again at
    once). ``dry_run`` only lists the due runs (``report.candidates``) and
    writes nothing. A sweep that finds another one running (its lease) does
    nothing (``report.busy``). A failing page is logged and counted in
    ``report.failed``; the next sweep resumes.
    """
    pol = policy()
    now = now or clock.now()
    batch = min(1000, max(1, batch or pol.batch))
    report = SweepReport(started_at=clock.now_ms(), enabled=pol.enabled, dry_run=dry_run)
    if dry_run:
        report.candidates = due_runs(now, batch, pol) if pol.enabled else []
        report.finished_at = clock.now_ms()
        return report
    if not _take_lease("retention", report.started_at):
        report.busy = True
        report.finished_at = clock.now_ms()
        return report
    try:
        settling = now - timedelta(milliseconds=settle_ms())
        open_tombs = list(
            RunTombstone.objects.exclude(phase="done").exclude(phase="settle", tombstoned_at__gt=settling)
            .order_by("tombstoned_at").values_list("run_id", flat=True)[:batch]
        )
        expired: list[str] = []
        left = batch - len(open_tombs)
        if pol.enabled and left > 0:
            due = due_runs(now, left, pol)
            report.more = len(due) >= left
            try:
                expired = expire_runs([c["runId"] for c in due], now, pol=pol)
            except Exception:  # noqa: BLE001 - logged; nothing of the batch was fenced
                report.failed += len(due)
                log.exception("retention: expiring %d runs failed", len(due))
        else:
            report.more = len(open_tombs) >= batch
        report.expired = len(expired)
        metrics.record_expired(report.expired)
        if open_tombs or expired:
            try:
                cleaned, waiting = clean_runs(open_tombs + expired, now)
                report.cleaned, report.waiting = cleaned, waiting
            except Exception:  # noqa: BLE001 - logged; the next sweep resumes these runs
                report.failed += 1
                log.exception("retention: cleanup failed")
            report.resumed = len(open_tombs)
        report.stragglers = _delete_stragglers()
    finally:
        report.finished_at = clock.now_ms()
        _finish("retention", report.as_dict(), report.finished_at)
    return report


def _delete_stragglers() -> int:
    """Queue messages and dead letters that arrived for runs already expired (at most ``PAGE`` of each)."""
    from queueing.models import DeadLetter, Message

    total = 0
    for model in (Message, DeadLetter):
        table = wsql.table(model)
        runs = _rows(
            f'SELECT DISTINCT m."run_id" FROM "{table}" m JOIN "{_CELL}" c ON c."name" = m."run_id" '
            f'WHERE m."run_id" IS NOT NULL AND c."expired" LIMIT %s',
            [PAGE],
        )
        if runs:
            tallies, _ = _delete_queue_rows([r for (r,) in runs], _Budget(4, 1.0))
            total += sum(n for kinds in tallies.values() for n in kinds.values())
    return total


def status() -> dict[str, Any]:
    """The settings, tombstone counts and last sweep (``manage.py retention``, the queue dashboard)."""
    pol = policy()
    state = LifecycleState.objects.filter(kind="retention").first()
    return {
        "retentionMs": pol.retention_ms,
        "maxAgeMs": pol.max_age_ms,
        "batch": pol.batch,
        "enabled": pol.enabled,
        "tombstones": RunTombstone.objects.count(),
        "cleaning": RunTombstone.objects.exclude(phase="done").count(),
        "lastStartedAt": state.last_started_at if state else None,
        "lastFinishedAt": state.last_finished_at if state else None,
        "lastResult": state.last_result if state else {},
    }


def describe_ms(ms: int | None) -> str:
    """``30d``, ``12h``, ``90m``, ``45s``, ``500ms`` or ``off``: a policy duration for people."""
    if ms is None:
        return "off"
    for unit, size in (("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
