"""Models of the run lifecycle: tombstones, stuck-run repair records, sweep state (docs/lifecycle.md).

* ``RunTombstone`` — what stays of an expired run: its id, workflow name,
  deployment, last status and timestamps, when it expired and when it was
  tombstoned, and the cleanup's progress (``phase``) and tallies. One row
  per run, never deleted. Written FIRST, in the same transaction that sets
  ``RunCellState.expired`` under the run cell's lock; from that commit on
  the run answers as expired, whatever of its data is still being deleted.
* ``FlowMessageRecord`` — the latest workflow (flow) message enqueued for a
  run: everything a repair needs to enqueue it again.
* ``RunRepair`` — one row per repaired stuck state ``(run, event sequence)``:
  the at-most-once record of stuck-run repair.
* ``LifecycleState`` — one row per sweep kind (``retention``, ``reconcile``):
  the last sweep's times and result, and the reconcile scan's cursor.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q

__all__ = ["FlowMessageRecord", "LifecycleState", "RunRepair", "RunTombstone", "CLEANUP_PHASES"]

#: Cleanup phases in order (docs/lifecycle.md "Deletion order"); ``done`` = finished.
CLEANUP_PHASES = ("hooks", "events", "steps", "streams", "queue", "run", "settle", "done")


class RunTombstone(models.Model):
    """The permanent record of an expired run (docs/lifecycle.md "Tombstones").

    Fields:
        run_id: the run id (= the run cell name); unique.
        workflow_name, deployment_id: as the run was created.
        status: the run's last status before it expired.
        created_at, started_at, completed_at, updated_at: the run's timestamps (UTC, ms).
        expired_at: the deadline at which the run expired (the earlier of the
            terminal-retention and maximum-age deadlines, or the manual time).
        tombstoned_at: when the sweep wrote this row.
        reason: ``terminal-retention``, ``maximum-age`` or ``manual``.
        phase: the next cleanup phase (``CLEANUP_PHASES``); ``done`` when finished.
        cleaned_at: when cleanup finished (NULL while it is in progress).
        deleted: ``{kind: rows deleted}`` tallies (events, steps, hooks, index keys, …).
        attempts: cleanup passes that worked on this run; last_error: the last failure.
    """

    run_id = models.TextField(unique=True)
    workflow_name = models.TextField()
    deployment_id = models.TextField()
    status = models.CharField(max_length=16)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    expired_at = models.DateTimeField()
    tombstoned_at = models.DateTimeField()
    reason = models.CharField(max_length=32)
    phase = models.CharField(max_length=16, default=CLEANUP_PHASES[0])
    cleaned_at = models.DateTimeField(null=True, blank=True)
    deleted = models.JSONField(default=dict)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(null=True, blank=True)

    class Meta:
        verbose_name = "run tombstone"
        indexes = [
            # unfinished cleanups, resumed first by every sweep
            models.Index(fields=["tombstoned_at"], name="cells_tombstone_open", condition=~Q(phase="done")),
            models.Index(fields=["expired_at"], name="cells_tombstone_expired_idx"),
        ]

    def __str__(self) -> str:
        return f"tombstone {self.run_id} ({self.status}, expired {self.expired_at:%Y-%m-%d %H:%M})"


class FlowMessageRecord(models.Model):
    """The latest workflow message enqueued for a run (docs/lifecycle.md "Stuck-run repair").

    Captured when a ``__wkf_workflow_*`` message is stored; a repair
    re-enqueues exactly this (queue name, body, target, shard count) under
    a fresh message id and a repair idempotency key.

    Fields:
        run_id: the run the body names; unique.
        queue_cell: the queue cell it went to (``q:<n>``).
        queue_name, pathname, target_base_url, queue_shards: as enqueued.
        body: the body string, codec-encoded like ``Message.body``.
        recorded_at: epoch ms of that enqueue (a later one replaces it).
    """

    run_id = models.TextField(unique=True)
    queue_cell = models.TextField()
    queue_name = models.TextField()
    pathname = models.TextField()
    body = models.TextField(help_text="codec-encoded body string")
    target_base_url = models.TextField()
    queue_shards = models.IntegerField()
    recorded_at = models.BigIntegerField()

    class Meta:
        verbose_name = "latest flow message"

    def __str__(self) -> str:
        return f"{self.queue_name} for {self.run_id}"


class RunRepair(models.Model):
    """One repair of one stuck state ``(run, event sequence)``: never two for the same state.

    Fields:
        run_id, event_sequence: the stuck state (the run's last event sequence number).
        message_id: the message the repair enqueued; queue_cell: where.
        idle_since: epoch ms of the run's last event (what "stuck since" shows).
        repaired_at: epoch ms of the repair.
    """

    run_id = models.TextField()
    event_sequence = models.BigIntegerField()
    message_id = models.TextField()
    queue_cell = models.TextField()
    idle_since = models.BigIntegerField()
    repaired_at = models.BigIntegerField()

    class Meta:
        verbose_name = "stuck-run repair"
        constraints = [models.UniqueConstraint(fields=["run_id", "event_sequence"], name="cells_runrepair_state")]

    def __str__(self) -> str:
        return f"repair {self.run_id} @{self.event_sequence}"


class LifecycleState(models.Model):
    """The state of one sweep kind (``retention`` or ``reconcile``).

    Fields:
        kind: ``retention`` or ``reconcile``; unique.
        last_started_at, last_finished_at: epoch ms of the last sweep (NULL = never).
        last_result: the last sweep's report (counts, rate, errors).
        cursor: reconcile: the run cell id the next scan starts after.
    """

    kind = models.CharField(max_length=16, unique=True)
    last_started_at = models.BigIntegerField(null=True, blank=True)
    last_finished_at = models.BigIntegerField(null=True, blank=True)
    last_result = models.JSONField(default=dict)
    cursor = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "lifecycle sweep state"

    def __str__(self) -> str:
        return self.kind
