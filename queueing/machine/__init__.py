"""The queue state machine: every transition of a queue cell (docs/protocol.md §7).

A message lives in ``Message`` from enqueue until it is acked, dropped or
dead-lettered::

    enqueue ──> pending (due_at) ──claim──> in flight (inflight_deadline, claim_token)
                   ^    ^                        │
                   │    └── 503 {timeoutSeconds} ┤  (not counted, key kept)
                   │    └── counted retry ───────┤  attempt+1, backoff min(60, 2^attempt) s
                   │    └── deadline passed ─────┤  (lost claim recovered by the next alarm)
                   │                             ├── 2xx ─────────────> acked (row deleted)
                   │                             ├── 404/409/410/422 ─> dropped (row deleted)
                   └── redrive <── DeadLetter <──┘  attempt reaches QUEUE_MAX_ATTEMPTS

Rules every function here follows:

* each transition is ONE short transaction that first locks the cell's
  ``QueueCell`` row (``SELECT … FOR UPDATE``; on SQLite the IMMEDIATE
  transaction is the lock), reads ``now`` once and ends with the alarm helper
  the spec names (§7.8);
* outcomes of a delivery are applied only while the claim token still
  matches (compare-and-set), so a late or duplicated delivery task can never
  apply an outcome twice or touch a newer claim — except an ack (2xx) or a
  drop, which deletes the message whatever its claim state, as upstream's
  ack does (the application accepted it; a message is deleted only once);
* nothing here does network I/O; wake-ups of the driver (Celery or the
  in-process pump) are registered with ``transaction.on_commit`` so they
  happen only once the transition is durable (docs/architecture.md rules 3 and 6);
* every transaction that held a cell's lock wakes the cell on commit when
  work is due, so a wake-up that finds the cell locked may simply skip it
  (``SKIP LOCKED``) — the lock holder will wake it again (an enqueue into a
  cell whose slots are all taken needs none: see ``enqueue_batch``);
* a delivery's outcome transaction may run the claim phase itself
  (``claim_next``) so a freed in-flight slot is refilled at once (§12 A14);
  while every slot is busy, alarm firings are skipped instead of polling.

Where each part lives (one module per seam; this package re-exports the public names)::

    values.py        requests, claims, the delivery row, reports; dlq keys, backoff
    sql.py           the SQL text, composed from named fragments, each rule once
    db.py            the one module that runs SQL (Django's cursor; one-trip scripts)
    lock.py          the cell lock and the alarm rules (armAlarmAtMost, scheduleNextAlarm)
    enqueueing.py    enqueue (§7.3), combined batches, the one-trip enqueue
    claim.py         the claim phase, firing alarms (§7.4, §9.1), start_delivery
    outcomes.py      ack / drop / redeliver / retry (§7.6, §7.7), the one-trip outcomes
    dead_letters.py  burying, listing, redriving and purging dead letters (§7.9)
    rearm.py         stats, rearmAlarm, rearm_cell (§7.9, manage.py rearm_alarms)

Throughput (the cell lock is the bottleneck of a busy cell, so everything
that holds it is kept short):

* the delivery path's statements are fixed SQL text, not querysets;
* concurrent enqueues into a cell, and concurrent outcomes of its
  deliveries, from threads of one process are combined into one transaction
  (``queueing.combining``, ``enqueue_batch``, ``apply_outcomes``); an outcome
  transaction claims for all the slots it freed and marks the first claim of
  each delivery thread as started (``Claim.started``);
* on PostgreSQL the common enqueue and ack(+claim) transitions run as one
  ``BEGIN; …; COMMIT`` round trip (see ``enqueue._enqueue_in_one_trip`` and ``outcomes._outcomes_in_one_trip``), and
  outcome transactions commit without waiting for the WAL flush (see
  ``apply_outcomes``).

The one statement that runs without the cell lock is ``start_delivery``: a
single-row compare-and-set (``UPDATE … RETURNING``) that marks "the POST of
this claim has begun" so a duplicated delivery task cannot POST the same
claim twice.
"""
from __future__ import annotations

# Underscored names and Dispatch are re-exported for the tests and the drivers (noqa: F401).
from .claim import (
    _cell_state,
    cell_alarms,
    claim_due_messages,
    due_cell_names,
    fire_cell_alarm,
    fire_due_alarms,
    start_delivery,
)
from .dead_letters import list_dead_letters, purge_dead_letters, redrive_dead_letter
from .enqueueing import _enqueue_in_one_trip, _known_cells, enqueue, enqueue_batch
from .lock import _lock_cell, arm_alarm_at_most, schedule_next_alarm
from .outcomes import (
    _outcomes_in_one_trip,
    ack_message,
    apply_outcome,
    apply_outcomes,
    drop_message,
    redeliver_later,
    retry_message,
)
from .rearm import cell_stats, rearm_alarm, rearm_cell
from .values import (
    Claim,
    DeliveryRow,
    Dispatch,
    EnqueueRequest,
    OutcomeRequest,
    RearmReport,
    backoff_seconds,
    clamp_ms,
    dlq_key,
    ms13,
)

__all__ = [
    "Claim",
    "DeliveryRow",
    "EnqueueRequest",
    "OutcomeRequest",
    "RearmReport",
    "ack_message",
    "apply_outcome",
    "arm_alarm_at_most",
    "backoff_seconds",
    "cell_stats",
    "clamp_ms",
    "claim_due_messages",
    "dlq_key",
    "drop_message",
    "cell_alarms",
    "due_cell_names",
    "enqueue",
    "enqueue_batch",
    "fire_cell_alarm",
    "fire_due_alarms",
    "list_dead_letters",
    "ms13",
    "purge_dead_letters",
    "rearm_alarm",
    "rearm_cell",
    "redeliver_later",
    "redrive_dead_letter",
    "retry_message",
    "schedule_next_alarm",
    "start_delivery",
]
