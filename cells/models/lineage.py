"""The link between a run and the run an operator started from it (docs/lifecycle.md §8, "Run links").

``RunLink`` — one row per run started by the console's *Re-run* from another
run: the new run's id, the original's id, who asked and when. Both ids are
plain text, never foreign keys: retention deletes run rows (and a tombstone
keeps only the id), so the link outlives either run and the pages of both
keep showing it (the by-id link of an expired run leads to its tombstone).
The sweep never deletes these rows (a few hundred bytes per re-run).

``(source_run_id, request_key)`` is unique: the confirmation page hands out
one key per request, so a double-submitted form starts ONE new run.
"""
from __future__ import annotations

from django.db import models

__all__ = ["RunLink"]


class RunLink(models.Model):
    """``run_id`` was started by an operator as a re-run of ``source_run_id``.

    Fields:
        run_id: the new run (``wrun_…``); unique.
        source_run_id: the run it re-runs.
        kind: ``rerun`` (the only kind so far).
        request_key: the confirmation page's key (unique per source run).
        created_at: when the operator confirmed (UTC).
        created_by: the operator's user name ("" from the shell).
    """

    run_id = models.TextField(unique=True)
    source_run_id = models.TextField()
    kind = models.CharField(max_length=16, default="rerun")
    request_key = models.TextField()
    created_at = models.DateTimeField()
    created_by = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "run link"
        # also the index of "re-runs of this run" (its leading column)
        constraints = [
            models.UniqueConstraint(fields=["source_run_id", "request_key"], name="cells_runlink_request"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind} of {self.source_run_id}"
