"""Celery tasks of the run lifecycle (docs/lifecycle.md "Scheduling").

``lifecycle_sweep`` — beat, every ``WORLDCELL_LIFECYCLE_INTERVAL_S`` (30 s):
one retention sweep and one stuck-run reconcile pass (``cells.ticker.tick``).
When the sweep found a full batch it sends itself again at once, so a
backlog drains batch by batch; the sweep's lease keeps two runs from
overlapping.
"""
from __future__ import annotations

from celery import shared_task
from django.db import close_old_connections

__all__ = ["lifecycle_sweep"]


@shared_task(ignore_result=True)
def lifecycle_sweep() -> None:
    from .ticker import tick

    close_old_connections()
    try:
        more = tick()
    finally:
        close_old_connections()
    if more:
        lifecycle_sweep.apply_async(expires=60)
