"""Models of the runs cell: one run = one cell (docs/protocol.md §5.9, docs/architecture.md).

Upstream keeps a run cell as keys in one private map (``run``, ``step:<id>``,
``stepcreated:<ISO>:<id>``, ``hook:<id>``, ``hookevent:<id>``,
``event:<eventId>``, ``event_sequence``). Here each key family is a table an
operator can query:

==============================  ==========================================
upstream key                    row
==============================  ==========================================
``schema_version``,             ``RunCellState`` (the lock target; exists
``event_sequence``              before the run does)
``run``                         ``Run`` (primary key = the cell row)
``step:<id>`` +                 ``Step`` (``sort_key`` = ``<ISO>:<id>``)
``stepcreated:<ISO>:<id>``
``hook:<id>`` +                 ``Hook`` (live hooks only)
``hookcreated:<ISO>:<id>``
``hookevent:<id>``              ``HookMarker`` (outlives the hook)
``event:<eventId>``             ``Event`` (the whole encoded event in ``body``)
==============================  ==========================================

Payload columns (input, output, error, executionContext, metadata, the event
body) hold codec-encoded JSON text (``worldcell.codec``): full fidelity for
Dates, bytes and U+0000, which PostgreSQL ``jsonb`` would reject. SQL NULL in
a payload column means "absent".

``Run``, ``Step`` and ``Hook`` declare their wire shape: ``MEMBERS`` maps
each wire member to its column in the wire order, ``PAYLOADS`` names the
codec-encoded members, ``CONSTANTS`` the members every entity carries
unchanged. ``cells.run_store`` reads and writes the rows by that map (the
persistence engine of the cell lives there, not here).

Range-scanned key columns (``Step.sort_key``, ``Hook.sort_key``,
``Event.event_id``) compare bytewise (``BytewiseTextField``), so a cursor
string sent by a client is compared exactly as upstream compares keys (§4.0).
"""
from __future__ import annotations

from datetime import datetime

from django.db import models

from worldcell import codec
from worldcell.fields import BytewiseTextField  # also the path the migrations name

from ..event_schemas import RUN_STATUSES, STEP_STATUSES

__all__ = ["BytewiseTextField", "EntityRow", "Event", "Hook", "HookMarker", "Run", "RunCellState", "Step", "creation_sort_key"]


class EntityRow:
    """Base of the models whose row stores one wire entity: the declaration of its wire shape.

    ``MEMBERS`` maps each wire member to its column, in the wire order;
    members in ``PAYLOADS`` are stored as codec-encoded text; ``CONSTANTS``
    are members every entity of the kind carries unchanged. ``cells.run_store``
    (``RowMapper``) converts rows and entities by it.
    """

    MEMBERS: dict[str, str] = {}
    PAYLOADS: frozenset[str] = frozenset()
    CONSTANTS: dict[str, object] = {}


class RunCellState(models.Model):
    """One run cell: the row every ``applyEvent`` on the run locks first.

    It exists before the run entity does (created on the first call that
    writes), so two concurrent ``run_created`` for one run queue on its lock
    instead of racing on an insert.

    Fields:
        name: the cell name = the run id (``wrun_…``); unique.
        event_sequence: the last event sequence number handed out; event ids
            are ``wevt_z`` + this number zero-padded to 20 digits (§5.5).
        schema_version: the run-cell layout version (§10); every cell
            written by worldcell is at version 3.
    """

    name = models.TextField(help_text="cell name = run id")
    event_sequence = models.BigIntegerField(default=0, help_text="last event sequence number handed out")
    schema_version = models.PositiveSmallIntegerField(default=3)
    # Retention fence (docs/lifecycle.md "Tombstones"): set, under this row's lock,
    # in the transaction that writes the run's tombstone; never cleared. The row
    # itself is never deleted, so a late event finds it and answers RUN_EXPIRED.
    expired = models.BooleanField(default=False, db_default=False, help_text="the run expired (see its tombstone)")

    class Meta:
        verbose_name = "run cell"
        constraints = [models.UniqueConstraint(fields=["name"], name="cells_runcellstate_name_uniq")]
        # + on PostgreSQL a pg_trgm GIN index on UPPER(name) (migration 0003, docs/console.md "Search")

    def __str__(self) -> str:
        return self.name


class Run(EntityRow, models.Model):
    """The run entity of a run cell (docs/protocol.md §5.2 WorkflowRun).

    Fields:
        cell: the owning cell (primary key); ``cell.name`` is the run id.
        status: pending | running | completed | failed | cancelled.
        deployment_id, workflow_name: as sent with ``run_created``.
        spec_version: the spec version of the request that created the run.
        execution_context, input, output, error: codec-encoded JSON, NULL = absent.
        started_at, completed_at, expired_at: NULL = absent (expired_at is never set).
        created_at, updated_at: UTC, millisecond precision.
    """

    MEMBERS = {
        "status": "status",
        "deploymentId": "deployment_id",
        "workflowName": "workflow_name",
        "specVersion": "spec_version",
        "executionContext": "execution_context",
        "input": "input",
        "output": "output",
        "error": "error",
        "expiredAt": "expired_at",
        "startedAt": "started_at",
        "completedAt": "completed_at",
        "createdAt": "created_at",
        "updatedAt": "updated_at",
    }
    PAYLOADS = frozenset({"executionContext", "input", "output", "error"})

    cell = models.OneToOneField(RunCellState, primary_key=True, on_delete=models.CASCADE, related_name="run")
    status = models.CharField(max_length=16, choices=[(s, s) for s in RUN_STATUSES])
    deployment_id = models.TextField()
    workflow_name = models.TextField()
    spec_version = models.FloatField(null=True, blank=True)
    execution_context = models.TextField(null=True, blank=True, help_text="codec-encoded JSON object")
    input = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    output = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    error = models.TextField(null=True, blank=True, help_text="codec-encoded StructuredError")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "run"
        # Operator actions beyond viewing (the console's run actions, docs/operations.md "Console actions").
        permissions = [
            ("cancel_run", "Can cancel runs (records a run_cancelled event)"),
            ("rerun_run", "Can re-run runs (starts a new run with the same input)"),
            ("wake_run", "Can wake up runs (completes their pending sleeps)"),
            ("reenqueue_run", "Can re-enqueue the workflow message of runs"),
        ]
        indexes = [
            models.Index(fields=["status"], name="cells_run_status_idx"),
            models.Index(fields=["workflow_name"], name="cells_run_workflow_idx"),
            models.Index(fields=["deployment_id"], name="cells_run_deployment_idx"),
            models.Index(fields=["created_at"], name="cells_run_created_idx"),
            models.Index(fields=["completed_at"], name="cells_run_completed_idx"),  # retention (cells.lifecycle)
            # + on PostgreSQL pg_trgm GIN indexes on UPPER(workflow_name), UPPER(deployment_id)
            #   (migration 0003, docs/console.md "Search")
        ]

    def __str__(self) -> str:
        return f"run {self.cell_id} ({self.status})"


def creation_sort_key(created_at: datetime, entity_id: str) -> str:
    """``<ISO createdAt>:<id>``: the ``stepcreated:``/``hookcreated:`` key suffix and P2 cursor (§4.0)."""
    return f"{codec.format_iso(created_at)}:{entity_id}"


class Step(EntityRow, models.Model):
    """A step of a run (docs/protocol.md §5.2 Step).

    Fields:
        run: the owning run.
        step_id: the step id (the ``correlationId`` of its events); unique per run.
        step_name, status, attempt: as on the wire.
        input, output, error: codec-encoded JSON, NULL = absent.
        started_at, completed_at, retry_after: NULL = absent.
        created_at, updated_at: UTC, millisecond precision.
        spec_version: the spec version of the request that created the step.
        sort_key: ``<ISO createdAt>:<stepId>``, bytewise; ``listSteps`` pages by it.
    """

    MEMBERS = {
        "stepId": "step_id",
        "stepName": "step_name",
        "status": "status",
        "input": "input",
        "output": "output",
        "error": "error",
        "attempt": "attempt",
        "startedAt": "started_at",
        "completedAt": "completed_at",
        "createdAt": "created_at",
        "updatedAt": "updated_at",
        "retryAfter": "retry_after",
        "specVersion": "spec_version",
    }
    PAYLOADS = frozenset({"input", "output", "error"})

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.TextField()
    step_name = models.TextField()
    status = models.CharField(max_length=16, choices=[(s, s) for s in STEP_STATUSES])
    attempt = models.BigIntegerField(default=0)
    input = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    output = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    error = models.TextField(null=True, blank=True, help_text="codec-encoded StructuredError")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    retry_after = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    spec_version = models.FloatField(null=True, blank=True)
    sort_key = BytewiseTextField(help_text="<ISO createdAt>:<stepId>, the listSteps order and cursor")

    class Meta:
        verbose_name = "step"
        constraints = [models.UniqueConstraint(fields=["run", "step_id"], name="cells_step_run_step_uniq")]
        indexes = [models.Index(fields=["run", "sort_key"], name="cells_step_run_sort_idx")]

    def __str__(self) -> str:
        return f"step {self.step_id} ({self.status})"


class Hook(EntityRow, models.Model):
    """A live hook of a run (docs/protocol.md §5.2 Hook); deleted on dispose or terminal run.

    Fields:
        run: the owning run.
        hook_id: the hook id (the ``correlationId`` of its events); unique per run.
        token: the hook token (globally owned through the index cell, §6.3).
        metadata: codec-encoded JSON, NULL = absent.
        is_webhook: as sent with ``hook_created`` (default false).
        created_at: UTC, millisecond precision.
        spec_version: the spec version of the request that created the hook.
        sort_key: ``<ISO createdAt>:<hookId>``, bytewise; ``listHooks`` pages by it.

    ``ownerId``, ``projectId`` and ``environment`` are always ``""`` (§5.2)
    and are not stored.
    """

    MEMBERS = {
        "hookId": "hook_id",
        "token": "token",
        "metadata": "metadata",
        "createdAt": "created_at",
        "specVersion": "spec_version",
        "isWebhook": "is_webhook",
    }
    PAYLOADS = frozenset({"metadata"})
    CONSTANTS = {"ownerId": "", "projectId": "", "environment": ""}

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="hooks", db_index=False)
    hook_id = models.TextField()
    token = models.TextField()
    metadata = models.TextField(null=True, blank=True, help_text="codec-encoded JSON")
    is_webhook = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    spec_version = models.FloatField(null=True, blank=True)
    sort_key = BytewiseTextField(help_text="<ISO createdAt>:<hookId>, the listHooks order and cursor")

    class Meta:
        verbose_name = "hook"
        constraints = [models.UniqueConstraint(fields=["run", "hook_id"], name="cells_hook_run_hook_uniq")]
        indexes = [
            models.Index(fields=["run", "sort_key"], name="cells_hook_run_sort_idx"),
            models.Index(fields=["token"], name="cells_hook_token_idx"),
        ]

    def __str__(self) -> str:
        return f"hook {self.hook_id}"


class HookMarker(models.Model):
    """``hookevent:<hookId>``: a hook was created on this run (docs/protocol.md §5.6, quirk Q5).

    Never deleted, so a hook id is never created twice on one run, even
    after the hook was disposed or released.

    Fields:
        run: the owning run.
        hook_id: the hook id; unique per run.
        event_id: the id of the ``hook_created`` event that created it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="hook_markers", db_index=False)
    hook_id = models.TextField()
    event_id = models.TextField()

    class Meta:
        verbose_name = "hook marker"
        constraints = [models.UniqueConstraint(fields=["run", "hook_id"], name="cells_hookmarker_run_hook_uniq")]

    def __str__(self) -> str:
        return f"hook {self.hook_id} created by {self.event_id}"


class Event(models.Model):
    """One event of a run's append-only log (docs/protocol.md §5.2 Event).

    Fields:
        run: the owning run.
        event_id: ``wevt_z`` + the 20-digit sequence; unique per run, bytewise,
            so its order is the log order and ``listEvents`` cursors compare exactly.
        sequence: the event's sequence number (the digits of ``event_id``).
        event_type, correlation_id, created_at: copies of the event's members
            for operators (filtering, timelines).
        body: the whole event, codec-encoded, exactly as ``getEvent`` returns it.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    event_id = BytewiseTextField()
    sequence = models.BigIntegerField()
    event_type = models.CharField(max_length=32)
    correlation_id = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField()
    body = models.TextField(help_text="codec-encoded event")

    class Meta:
        verbose_name = "event"
        constraints = [models.UniqueConstraint(fields=["run", "event_id"], name="cells_event_run_event_uniq")]
        indexes = [models.Index(fields=["correlation_id"], name="cells_event_correlation_idx")]

    def __str__(self) -> str:
        return f"{self.event_id} {self.event_type}"
