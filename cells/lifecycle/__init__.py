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

Where each part lives (one module per seam; this package re-exports the names
the rest of the project and the tests use, so ``from cells import lifecycle;
lifecycle.sweep()`` and ``from cells.lifecycle import listing_keys`` are the
ways in)::

    policies.py   Policy, policy(), settle_ms, describe_ms: the settings
    store.py      statements, the client's index keys of a run, tombstone tallies
    expiry.py     expire_runs: the tombstones and the fence, one transaction
    cleanup.py    clean_runs: the paged deletion, phase by phase (PAGE, the duty cycle)
    sweeper.py    sweep: one tick (due runs, the lease, stragglers), status

A test that changes a part's setting or helper patches it where it lives
(``cells.lifecycle.cleanup.PAGE``, ``cells.lifecycle.store.delete_index_keys``): the
parts read those two through their home module, never a copy of their own.
"""
from __future__ import annotations

from queueing.runref import run_of_message  # noqa: F401 - re-exported

from ..fence import (  # noqa: F401 - re-exported: the guards live in cells.fence
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
from .cleanup import PAGES_PER_TICK, clean_run, clean_runs, duty_cycle  # noqa: F401 - re-exported
from .expiry import expire_run, expire_runs  # noqa: F401 - re-exported
from .policies import TERMINAL_STATUSES, Policy, describe_ms, policy, settle_ms  # noqa: F401 - re-exported
from .store import INDEX_CELL, correlation_key, listing_keys  # noqa: F401 - re-exported
from .sweeper import LEASE_S, SweepReport, due_runs, status, sweep  # noqa: F401 - re-exported

__all__ = [
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

