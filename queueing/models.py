"""Models of the queue cells (docs/protocol.md §7.1, docs/architecture.md "Delivery").

Upstream keeps a queue cell as keys in one ordered map; worldcell keeps the
same state in three tables an operator can query:

================================  ==========================================
upstream key                      worldcell row
================================  ==========================================
``cfg``                           ``QueueCell.queue_shards`` / ``pinned_at``
(the cell's alarm)                ``QueueCell.alarm_at``
``msg:<id>``                      one ``Message`` row
``due:<ms13>:<id>``               ``Message.due_at`` (NULL = not scheduled)
``inflight:<id>``                 ``Message.inflight_deadline`` (NULL = not claimed)
``key:<idempotencyKey>``          the live ``Message`` with that ``idempotency_key``
``dlq:<ms13 failedAt>:<id>``      one ``DeadLetter`` row (``dlq_key`` is the key)
================================  ==========================================

A message row exists from enqueue until it is acked, dropped or dead-lettered,
so "the key is held" is simply "a message row with that key exists" (a
partial unique constraint keeps one holder per key and cell). All times are
integer epoch milliseconds, as on the wire. The body is stored codec-encoded
(a JSON string literal, docs/architecture.md rule 5) so U+0000 and lone surrogates are
safe in PostgreSQL; ``Message.body_text`` gives it back.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from worldcell import codec
from worldcell.fields import BytewiseTextField  # also the path the migrations name

__all__ = ["BytewiseTextField", "DeadLetter", "DeliveryAttempt", "Message", "OutcomeMinute", "QueueCell"]


class QueueCell(models.Model):
    """One queue shard ``q:<n>``: its pinned config and its alarm.

    The row is the cell's lock: every transition of the cell runs in one
    transaction that first takes ``SELECT … FOR UPDATE`` on it (docs/architecture.md rule 1).
    """

    name = models.TextField(unique=True, help_text="cell name, e.g. q:0")
    queue_shards = models.IntegerField(
        null=True, blank=True, help_text="shard count pinned by the first enqueue (cfg.queueShards)"
    )
    pinned_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms of the pin (cfg.pinnedAt)")
    alarm_at = models.BigIntegerField(
        null=True, blank=True, db_index=True, help_text="epoch ms when the cell wants its alarm; NULL = none"
    )

    class Meta:
        verbose_name = "queue cell"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Message(models.Model):
    """One live queue message: pending (``due_at`` set) and/or claimed (``inflight_deadline`` set).

    ``attempt`` counts completed *counted* delivery attempts; the wire header
    ``x-vqs-message-attempt`` is ``attempt + 1``. ``deliveries`` counts every
    POST started (including 503-redeliveries that are not counted). A claim is
    identified by ``claim_token``; an outcome is applied only while the token
    still matches (compare-and-set), and ``delivery_started_at`` marks that
    the POST of the current claim has begun, so a duplicated delivery task
    cannot POST the same claim twice.
    """

    # no index of its own: the unique (cell, message_id) index leads with it
    cell = models.ForeignKey(QueueCell, on_delete=models.CASCADE, related_name="messages", db_index=False)
    message_id = BytewiseTextField()
    queue_name = models.TextField()
    pathname = models.TextField()
    body = models.TextField(help_text="codec-encoded body string (a JSON string literal)")
    target_base_url = models.TextField()
    idempotency_key = BytewiseTextField(null=True, blank=True)
    attempt = models.IntegerField(default=0)
    enqueued_at = models.BigIntegerField()
    due_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms; NULL = not scheduled")
    inflight_deadline = models.BigIntegerField(
        null=True, blank=True, help_text="epoch ms after which a claim counts as lost; NULL = not claimed"
    )
    claim_token = models.CharField(max_length=32, null=True, blank=True)
    delivery_started_at = models.BigIntegerField(null=True, blank=True)
    deliveries = models.IntegerField(default=0, help_text="POSTs started, counted or not")
    last_error = models.TextField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True, help_text="HTTP status of the last answer")
    last_attempt_at = models.BigIntegerField(null=True, blank=True, help_text="epoch ms the last POST started")
    updated_at = models.BigIntegerField(help_text="epoch ms of the last transition")
    # The run the body names (runId / workflowRunId), for retention cleanup (docs/lifecycle.md).
    run_id = models.TextField(null=True, blank=True, help_text="run named by the body, if any")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cell", "message_id"], name="queue_message_unique_id"),
            models.UniqueConstraint(
                fields=["cell", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False) & ~Q(idempotency_key=""),
                name="queue_message_unique_key",
            ),
        ]
        # Partial indexes: a queue table churns (every claim and outcome writes a
        # new row version), and an index over every row makes the in-flight
        # count and the next-due lookup wade through all of a cell's rows and
        # their dead versions. These hold only the scheduled, respectively the
        # claimed, versions; every query on them says "IS NOT NULL" (or a
        # comparison, which implies it) so both PostgreSQL and SQLite use them.
        indexes = [
            # claim_due_messages: earliest due first per cell; also counts pending.
            models.Index(
                fields=["cell", "due_at", "message_id"],
                name="queue_message_due",
                condition=Q(due_at__isnull=False),
            ),
            # recovery of lost claims, inflight counts, next deadline.
            models.Index(
                fields=["cell", "inflight_deadline"],
                name="queue_message_inflight",
                condition=Q(inflight_deadline__isnull=False),
            ),
            # retention cleanup and stuck-run checks look messages up by run
            models.Index(fields=["run_id"], name="queue_message_run", condition=Q(run_id__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.message_id

    @property
    def body_text(self) -> str:
        """The body exactly as the client sent it."""
        return codec.decode(self.body)

    @property
    def state(self) -> str:
        """``"in flight"``, ``"pending"`` or ``"idle"`` (for operators)."""
        if self.inflight_deadline is not None:
            return "in flight"
        return "pending" if self.due_at is not None else "idle"


class DeadLetter(models.Model):
    """A message that failed ``QUEUE_MAX_ATTEMPTS`` counted deliveries (docs/protocol.md §7.7).

    ``dlq_key`` is the upstream key ``dlq:<ms13 failedAt>:<messageId>``; the
    P4 listing orders by it and returns it as the cursor (§4.0).
    """

    cell = models.ForeignKey(QueueCell, on_delete=models.CASCADE, related_name="dead_letters")
    dlq_key = BytewiseTextField()
    message_id = BytewiseTextField()
    queue_name = models.TextField()
    pathname = models.TextField()
    body = models.TextField(help_text="codec-encoded body string (a JSON string literal)")
    target_base_url = models.TextField()
    idempotency_key = models.TextField(null=True, blank=True)
    attempt = models.IntegerField()
    enqueued_at = models.BigIntegerField()
    last_error = models.TextField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True)
    deliveries = models.IntegerField(default=0)
    failed_at = models.BigIntegerField()
    run_id = models.TextField(null=True, blank=True, help_text="run named by the body, if any")

    class Meta:
        verbose_name = "dead letter"
        # Operator actions beyond viewing (the admin's "Redrive" and "Purge").
        permissions = [
            ("redrive_deadletter", "Can redrive dead letters"),
            ("purge_deadletter", "Can purge dead letters"),
            ("redrive_edited_url", "Can redrive dead letters to an edited target URL"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["cell", "dlq_key"], name="queue_deadletter_unique_key"),
        ]
        indexes = [
            models.Index(fields=["cell", "message_id"], name="queue_deadletter_message"),
            models.Index(fields=["run_id"], name="queue_deadletter_run", condition=Q(run_id__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.dlq_key

    @property
    def body_text(self) -> str:
        """The body exactly as the client sent it."""
        return codec.decode(self.body)


class DeliveryAttempt(models.Model):
    """One POST of a queue message that did not end its life: when, how long, what came back (docs/queue-console.md).

    Written by ``queueing.attempt_log`` in the outcome's own transaction (a
    counted retry, a 503 redelivery, the attempt that dead-lettered it); an
    ack or drop deletes the message's attempts with it. Keyed by
    ``(cell_id, message_id)`` so the log outlives the move to ``DeadLetter``
    and continues after a redrive; at most ``attempt_log.KEEP_PER_MESSAGE``
    rows per message. No foreign key: the row must not block or cascade
    with the message (retention prunes orphans, ``attempt_log.prune``).
    """

    cell_id = models.BigIntegerField()
    message_id = BytewiseTextField()
    attempt = models.IntegerField(help_text="x-vqs-message-attempt of the POST")
    started_at = models.BigIntegerField(help_text="epoch ms the POST started")
    duration_ms = models.IntegerField(help_text="ms from the start of the POST to its answer or error")
    status = models.IntegerField(null=True, blank=True, help_text="HTTP status; NULL for a transport error")
    error = models.TextField(null=True, blank=True, help_text="the retry reason (transport error text, HTTP <n>)")
    answer_head = models.TextField(
        null=True, blank=True, help_text="the first bytes of the answer body (attempt_log.HEAD_BYTES at most)"
    )
    result = models.TextField(help_text="what the outcome did: retry scheduled, redelivery scheduled, dead-lettered")

    class Meta:
        verbose_name = "delivery attempt"
        indexes = [models.Index(fields=["cell_id", "message_id", "id"], name="queue_attempt_message")]

    def __str__(self) -> str:
        return f"{self.message_id} #{self.attempt}"


class OutcomeMinute(models.Model):
    """Counters of applied delivery outcomes per (queue cell, queue name, minute) (docs/queue-console.md).

    Upserted in the outcome's own transaction under the cell's lock, so no
    writer ever waits on it; the dashboard sums the shards. ``minute`` is
    ``epoch ms // 60000``. Pruned after ``attempt_log.KEEP_MINUTES``.
    """

    cell_id = models.BigIntegerField()
    queue_name = models.TextField()
    minute = models.BigIntegerField(help_text="epoch ms // 60000")
    delivered = models.IntegerField(default=0, help_text="acked (2xx)")
    dropped = models.IntegerField(default=0, help_text="permanently refused (404/409/410/422)")
    retried = models.IntegerField(default=0, help_text="counted retries and 503 redeliveries")
    dead_lettered = models.IntegerField(default=0)

    class Meta:
        verbose_name = "outcome minute"
        constraints = [
            models.UniqueConstraint(fields=["cell_id", "queue_name", "minute"], name="queue_outcome_minute_unique"),
        ]
        indexes = [models.Index(fields=["minute"], name="queue_outcome_minute")]
