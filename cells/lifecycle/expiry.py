"""Expiry of a batch of runs: the tombstone and the fence, in ONE short transaction (docs/lifecycle.md §2).

Under the run cells' row locks: write each one's ``RunTombstone`` (phase
``hooks``), set ``RunCellState.expired`` and delete its two listing keys
(``run:`` and ``runall:``). From that commit on every read of the run
answers ``RunExpiredError`` (HTTP 410), every ``applyEvent`` the
``RUN_EXPIRED`` outcome, listings no longer see it — whatever of its data is
still there. The guards that answer so live in ``cells.fence``.
"""
from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction

from worldcell import clock

from ..models import Run, RunTombstone
from ..models.tombstone import CLEANUP_PHASES
from .policies import Policy, policy
from .store import (
    _CELL,
    _add_tallies,
    _marks,
    _rowcount,
    _rows,
    delete_index_keys_by_run,
    listing_keys,
)

__all__ = ["expire_run", "expire_runs"]


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
        deleted = delete_index_keys_by_run(keys)
        _add_tallies({t.run_id: {"index": deleted.get(t.run_id, 0)} for t in tombs}, {})
    return [t.run_id for t in tombs]


def expire_run(run_id: str, now: datetime | None = None, *, reason: str | None = None, pol: Policy | None = None) -> bool:
    """``expire_runs([run_id], …)``: True when this call expired the run."""
    return bool(expire_runs([run_id], now, reason=reason, pol=pol))
