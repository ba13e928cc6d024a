"""Values of the queue state machine: requests, claims, the delivery row, reports; keys and times (docs/protocol.md §7.1–7.7)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence, TypeVar

from worldcell.keys import clamp_ms, ms13

__all__ = [
    "Claim", "DeliveryRow", "Dispatch", "EnqueueRequest", "OutcomeRequest", "RearmReport",
    "backoff_seconds", "clamp_ms", "dlq_key", "fill_undecided", "ms13",
]

Dispatch = Callable[[list["Claim"]], None]


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated ``enqueue`` request (docs/protocol.md §7.3); times in seconds as sent."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    queue_shards: int
    idempotency_key: str | None = None
    delay_seconds: float | None = None
    #: the run the body names (``queueing.runref.run_of_message``), stored on the row for retention
    run_id: str | None = None
    #: refuse the message with ``RUN_EXPIRED`` when ``run_id`` has a tombstone (docs/lifecycle.md §3);
    #: checked inside the enqueue transaction (the queue service sets it for every message of a run)
    fence: bool = False
    #: when stored, also keep it as its run's latest workflow message (``FlowMessageRecord``,
    #: docs/lifecycle.md "Stuck-run repair"), in the same transaction
    record_flow: bool = False


@dataclass(frozen=True)
class Claim:
    """One claimed message, handed from the claim transaction to a delivery.

    ``token`` identifies this claim; outcomes apply only while the message
    still carries it. ``as_task_args()`` / ``from_task_args()`` turn it into
    plain values for a Celery task.

    ``started`` is set on a claim whose POST was marked begun in the claim
    transaction itself (``claim_due_messages(start=n)``, used when
    the claiming thread delivers it next): its delivery skips
    ``start_delivery``. Such a claim must be delivered in this process — a
    copy sent to another worker would find its POST already begun and skip it.
    """

    cell_name: str
    cell_id: int
    message_pk: int
    message_id: str
    token: str
    started: "DeliveryRow | None" = field(default=None, compare=False, repr=False)

    def as_task_args(self) -> list[Any]:
        return [self.cell_name, self.cell_id, self.message_pk, self.message_id, self.token]

    @classmethod
    def from_task_args(cls, args: Iterable[Any]) -> "Claim":
        cell_name, cell_id, message_pk, message_id, token = args
        return cls(cell_name, int(cell_id), int(message_pk), message_id, token)


@dataclass(frozen=True)
class DeliveryRow:
    """The message as it was when its claim's delivery began (the "row" of §7.5–7.7)."""

    message_id: str
    queue_name: str
    pathname: str
    body: str
    target_base_url: str
    idempotency_key: str | None
    attempt: int
    enqueued_at: int
    deliveries: int


#: The row argument of outcomes that do not read it (ack, drop, redeliver).
_NO_ROW = DeliveryRow("", "", "", "", "", None, 0, 0, 0)


@dataclass(frozen=True)
class RearmReport:
    """What ``rearm_cell`` found and changed on one cell (``manage.py rearm_alarms``)."""

    name: str
    pending: int
    inflight: int
    dead_letters: int
    alarm_before: int | None
    alarm_after: int | None
    recovered: int


@dataclass(frozen=True)
class OutcomeRequest:
    """One classified delivery result to apply (``apply_outcome``'s arguments)."""

    claim: Claim
    row: DeliveryRow
    kind: str
    status: int | None = None
    reason: str | None = None
    timeout_seconds: float | None = None
    claim_next: bool | int = False
    #: what the POST gave (``queueing.attempt_log.AttemptRecord``), recorded with the outcome; None records nothing
    attempt: Any = None


_OUTCOME_KINDS = ("ack", "drop", "redeliver", "retry")


# --------------------------------------------------------------------------- keys and times


def dlq_key(failed_at: int, message_id: str) -> str:
    """The dead-letter key ``dlq:<ms13 failedAt>:<messageId>`` (also the P4 cursor, §4.0)."""
    return f"dlq:{ms13(failed_at)}:{message_id}"


def backoff_seconds(attempt: int) -> int:
    """Delay before the next try after ``attempt`` counted failures: ``min(60, 2^attempt)`` s (§7.7)."""
    return 60 if attempt >= 6 else 2**attempt




# --------------------------------------------------------------------------- fast path, then general path

_Req = TypeVar("_Req")
_Res = TypeVar("_Res")


def fill_undecided(
    decided: list[_Res | None], requests: Sequence[_Req], general: Callable[[list[_Req]], list[_Res]]
) -> list[_Res]:
    """Fill the ``None`` entries of a one-trip result with ``general`` applied to their requests, in order."""
    rest = [i for i, r in enumerate(decided) if r is None]
    if rest:
        for i, r in zip(rest, general([requests[i] for i in rest])):
            decided[i] = r
    return decided  # type: ignore[return-value]
