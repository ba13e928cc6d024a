"""Delivering one claimed message: the HTTP POST and the response taxonomy (docs/protocol.md §7.5–7.6).

``deliver_claim(claim)`` is the whole life of one delivery, shared by the
Celery task and the in-process pump (both call it through
``deliver_and_claim_next``, which then refills the freed in-flight slot):

1. ``machine.start_delivery`` — compare-and-set "this claim's POST begins";
   a duplicated or stale delivery stops here;
2. ``post_message`` — the POST, with no database transaction or lock held
   (docs/architecture.md rule 6), classified by ``classify``;
3. ``machine.apply_outcome`` — one short transaction applies the result
   (``now`` re-read after the answer, §7.6).

The POST goes through ``queueing.httpclient`` (pooled keep-alive
connections, a total deadline, quick ACKs). Redirects are **not** followed
(§12 A8): a final 3xx is a counted retry ``HTTP 3xx``, whatever its
``Location``. Proxy environment variables are ignored, as with Node's ``fetch``.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from worldcell import clock, metrics

from . import attempt_log, config, httpclient, lease, machine
from .machine import Claim, DeliveryRow

log = logging.getLogger("queueing.delivery")

__all__ = [
    "DeliveryReport",
    "Outcome",
    "PERMANENT_STATUSES",
    "classify",
    "deliver_and_claim_next",
    "deliver_claim",
    "delivery_url",
    "post_message",
]

#: Statuses the application uses for "never retry this message" (§7.6).
PERMANENT_STATUSES = frozenset({404, 409, 410, 422})
#: Largest 503 body parsed for ``timeoutSeconds``; larger bodies count as unparseable.
_MAX_503_BODY = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Outcome:
    """A classified delivery result.

    ``kind``: ``"ack"`` (2xx), ``"drop"`` (404/409/410/422), ``"redeliver"``
    (503 with numeric ``timeoutSeconds``) or ``"retry"`` (everything else).
    ``status`` is the HTTP status (None for a transport error); ``reason`` the
    retry reason (``HTTP <status>`` / ``transport error: <text>``);
    ``timeout_seconds`` the 503 delay; ``answer_head`` the first bytes of
    the answer of a failed POST (``attempt_log.HEAD_BYTES`` at most; not
    compared).
    """

    kind: str
    status: int | None = None
    reason: str | None = None
    timeout_seconds: float | None = None
    answer_head: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class DeliveryReport:
    """One finished delivery, for logs: which message, which attempt, what happened, how long (ms)."""

    claim: Claim
    attempt_header: int
    outcome: Outcome
    result: str
    elapsed_ms: float
    next_claims: tuple[Claim, ...] = ()

    def log_line(self) -> str:
        """``queue q:0 msg_1 attempt=1 -> 200 acked (12 ms)`` (one line)."""
        answer = str(self.outcome.status) if self.outcome.status is not None else self.outcome.reason
        return (
            f"queue {self.claim.cell_name} {self.claim.message_id} attempt={self.attempt_header} "
            f"-> {answer} {self.result} ({self.elapsed_ms:.0f} ms)"
        )


def delivery_url(target_base_url: str, pathname: str) -> str:
    """``<targetBaseUrl minus one trailing "/">/.well-known/workflow/v1/<pathname>`` (§7.5)."""
    base = target_base_url[:-1] if target_base_url.endswith("/") else target_base_url
    return f"{base}/.well-known/workflow/v1/{pathname}"


def _utf8(text: str) -> bytes:
    """UTF-8 of ``text``; lone surrogates become U+FFFD, as ``fetch`` sends a JS string."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def _header(value: str) -> bytes:
    """A header value as ``fetch`` sends it (ByteString: latin-1); raises ValueError otherwise."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"TypeError: header value {value[:40]!r} is not a ByteString") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # JSON.parse rejects NaN / Infinity


def _timeout_seconds(body: bytes) -> float | None:
    """``timeoutSeconds`` of a 503 body when it is JSON with a numeric member, else None."""
    text = body.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        parsed = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    value = parsed.get("timeoutSeconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer literal beyond double range: JSON.parse gives ±Infinity
        return math.inf if value > 0 else -math.inf


def classify(status: int, body: bytes | None) -> Outcome:
    """The response taxonomy of §7.6 for an answer with ``status`` (``body`` read only for 503)."""
    if 200 <= status <= 299:
        return Outcome("ack", status)
    if status == 503:
        seconds = _timeout_seconds(body) if body is not None else None
        if seconds is not None:
            return Outcome("redeliver", status, timeout_seconds=seconds)
        return Outcome("retry", status, reason="HTTP 503")
    if status in PERMANENT_STATUSES:
        return Outcome("drop", status)
    return Outcome("retry", status, reason=f"HTTP {status}")


def _body_cap(status: int) -> int | None:
    return _MAX_503_BODY if status == 503 else None


def _head_cap(status: int) -> int:
    """Answer bytes kept for the attempt log: none for a 2xx or a permanent refusal (nothing is logged then)."""
    return 0 if 200 <= status <= 299 or status in PERMANENT_STATUSES else attempt_log.HEAD_BYTES


def _transport_error(exc: BaseException) -> Outcome:
    text = str(exc)
    if not text.startswith("TypeError:"):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return Outcome("retry", None, reason=f"transport error: {text}")


def post_message(row: DeliveryRow, *, timeout_ms: int | None = None, callback_secret: str | None = None) -> Outcome:
    """POST ``row`` to the application and classify the answer (§7.5, §7.6).

    Headers: ``content-type: application/json``, ``x-vqs-queue-name``,
    ``x-vqs-message-id``, ``x-vqs-message-attempt`` = ``row.attempt + 1`` and
    ``x-workflow-callback-secret`` when configured; the body is the stored
    string's UTF-8, byte for byte. ``timeout_ms`` (default
    ``QUEUE_DELIVERY_TIMEOUT_MS``) is a total deadline for the whole POST —
    connect, send, response headers and the capped body read — whatever the
    peer's pace (``queueing.httpclient``); exceeding it is a transport error.
    Never raises.
    """
    timeout_ms = config.delivery_timeout_ms() if timeout_ms is None else timeout_ms
    secret = config.callback_secret() if callback_secret is None else callback_secret
    try:
        headers = [
            (b"content-type", b"application/json"),
            (b"x-vqs-queue-name", _header(row.queue_name)),
            (b"x-vqs-message-id", _header(row.message_id)),
            (b"x-vqs-message-attempt", str(row.attempt + 1).encode()),
        ]
        if secret:
            headers.append((b"x-workflow-callback-secret", _header(secret)))
        url = delivery_url(row.target_base_url, row.pathname)
        # a 503's body (for timeoutSeconds) is read within the same deadline;
        # an unreadable, too large or too slow body counts as "not JSON"
        status, body, head = httpclient.post_answer(url, _utf8(row.body), headers, timeout_ms, _body_cap, _head_cap)
        outcome = classify(status, body)
        return replace(outcome, answer_head=head) if head else outcome
    except Exception as exc:  # noqa: BLE001 - every failure before an answer is a transport error
        return _transport_error(exc)


# --------------------------------------------------------------------------- one delivery


def deliver_claim(
    claim: Claim,
    *,
    claim_next: bool | int | Callable[[], bool | int] = False,
    leases: "lease.LeaseRenewer | None" = None,
) -> DeliveryReport | None:
    """Deliver one claimed message and apply the outcome; None if the claim was not ours to deliver.

    With ``claim_next`` (or when ``claim_next()`` says so once the answer is
    in) the outcome transaction also claims what the freed in-flight slot
    allows — at most ``n`` when it is an integer — and returns those claims
    in ``report.next_claims`` for the caller to deliver; the first of them is
    already marked begun (``Claim.started``) and must be delivered in this
    process. Otherwise (False, 0) the cell's driver is woken on commit.
    Database errors while applying the outcome propagate (the claim then
    stays in flight and is recovered after its deadline, §7.7).
    With ``leases`` (the driver's ``lease.LeaseRenewer``) the claim's lease is
    renewed from the start of the POST until its outcome was applied
    (docs/leases.md); without, it lapses after one lease.
    """
    row = claim.started if claim.started is not None else machine.start_delivery(claim)
    if row is None:
        log.info("queue cell %s: claim of %s is no longer current; not delivering", claim.cell_name, claim.message_id)
        return None
    if leases is not None:
        leases.hold(claim)
    try:
        started_at = clock.now_ms()
        started = time.monotonic()
        outcome = post_message(row)
        elapsed_ms = (time.monotonic() - started) * 1000
        want_next = claim_next() if callable(claim_next) else claim_next
        record = attempt_log.AttemptRecord(
            row.queue_name, row.attempt + 1, started_at, round(elapsed_ms), outcome.status,
            outcome.reason, outcome.answer_head, may_have_log=row.deliveries > 1 or row.attempt > 0,
        )
        result = machine.apply_outcome(
            claim,
            row,
            outcome.kind,
            status=outcome.status,
            reason=outcome.reason,
            timeout_seconds=outcome.timeout_seconds,
            claim_next=want_next,
            attempt=record,
        )
    finally:
        if leases is not None:
            leases.release(claim)
    next_claims: list[Claim] = []
    if want_next:
        result, next_claims = result
    if result == "stale":
        log.warning(
            "queue cell %s: outcome of %s (%s) arrived after its claim was recovered or the message "
            "was acked; ignored",
            claim.cell_name, claim.message_id, outcome.status or outcome.reason,
        )
    metrics.record_delivery(row, result, elapsed_ms / 1000)
    return DeliveryReport(claim, row.attempt + 1, outcome, result, elapsed_ms, tuple(next_claims))


def deliver_and_claim_next(
    claim: Claim,
    should_claim: Callable[[], bool | int] | None = None,
    leases: "lease.LeaseRenewer | None" = None,
) -> tuple[DeliveryReport | None, list[Claim]]:
    """Deliver ``claim``; its outcome transaction also refills the freed in-flight slot (§7.4, §12 A14).

    The worker that freed a slot claims the next due message itself instead
    of sending a wake-up through the broker, so a busy cell keeps its slots
    full without a round trip. ``should_claim()`` (checked once the answer is
    in) returning False skips that — a stopping pump claims nothing new —
    and returning an integer caps the claims (the pump's idle threads).
    Returns the report and the new claims (committed) for the caller to
    deliver; the first one is already started (``Claim.started``): deliver it
    in this process, never through the broker. ``leases`` as for ``deliver_claim``.
    """
    report = deliver_claim(claim, claim_next=should_claim if should_claim is not None else True, leases=leases)
    return report, list(report.next_claims) if report is not None else []
