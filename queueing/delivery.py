"""Delivering one claimed message: the HTTP POST and the response taxonomy (PROTOCOL.md §7.5–7.6).

``deliver_claim(claim)`` is the whole life of one delivery, shared by the
Celery task and the in-process pump (both call it through
``deliver_and_claim_next``, which then refills the freed in-flight slot):

1. ``machine.start_delivery`` — compare-and-set "this claim's POST begins";
   a duplicated or stale delivery stops here;
2. ``post_message`` — the POST, with no database transaction or lock held
   (DESIGN.md rule 6), classified by ``classify``;
3. ``machine.apply_outcome`` — one short transaction applies the result
   (``now`` re-read after the answer, §7.6).

Redirects are **not** followed (§12 A8): a final 3xx is a counted retry
``HTTP 3xx``, whatever its ``Location``. Proxy environment variables are
ignored (``trust_env=False``), as with Node's ``fetch``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import httpcore
import httpx
from httpcore._backends.sync import SyncStream as _SyncStream

from . import config, machine
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
#: Small bodies of other answers are read so the connection can be reused.
_MAX_DRAIN_BODY = 64 << 10
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Outcome:
    """A classified delivery result.

    ``kind``: ``"ack"`` (2xx), ``"drop"`` (404/409/410/422), ``"redeliver"``
    (503 with numeric ``timeoutSeconds``) or ``"retry"`` (everything else).
    ``status`` is the HTTP status (None for a transport error); ``reason`` the
    retry reason (``HTTP <status>`` / ``transport error: <text>``);
    ``timeout_seconds`` the 503 delay.
    """

    kind: str
    status: int | None = None
    reason: str | None = None
    timeout_seconds: float | None = None


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


# --------------------------------------------------------------------------- HTTP client

# The delivery timeout is a total wall-clock deadline for the whole POST
# (PROTOCOL.md §7.5): connect, send, response headers and the capped body read.
# httpx's own timeouts apply per socket operation, so a peer that drips one
# byte a second would never trip them. The client's network backend therefore
# bounds every blocking socket operation by ``min(httpx's timeout, time left
# until the deadline)``; the deadline of the POST in progress is thread-local
# (a sync httpx request does all its I/O on the calling thread, and a pooled
# connection serves one request at a time). Past the deadline the operation
# raises ``ReadTimeout`` / ``WriteTimeout`` / ``ConnectTimeout`` at once. Name
# resolution (``getaddrinfo``) cannot be bounded this way; targets are
# normally IP literals or local names.

_deadline = threading.local()


def _time_left(timeout: float | None) -> float | None:
    """``timeout`` capped by the time left until this thread's delivery deadline (None = no deadline)."""
    deadline = getattr(_deadline, "at", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        return 0.0
    return left if timeout is None else min(timeout, left)


def _deadline_text() -> str:
    return f"delivery deadline of {getattr(_deadline, 'ms', '?')} ms exceeded"


def _timeout_text(exc: BaseException) -> str:
    """Why a socket operation timed out: the delivery deadline, or httpx's own timeout."""
    left = _time_left(None)
    return _deadline_text() if left is not None and left <= 0 else (str(exc) or "timed out")


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose reads and writes never outlast the thread's delivery deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @staticmethod
    def _bounded(timeout: float | None, exc: type[Exception]) -> float | None:
        left = _time_left(timeout)
        if left is not None and left <= 0:
            raise exc(_deadline_text())
        return left

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            self._sock.settimeout(self._bounded(timeout, httpcore.ReadTimeout))
            return self._sock.recv(max_bytes)
        except socket.timeout as exc:
            raise httpcore.ReadTimeout(_timeout_text(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        try:
            while view:
                self._sock.settimeout(self._bounded(timeout, httpcore.WriteTimeout))
                view = view[self._sock.send(view):]
        except socket.timeout as exc:
            raise httpcore.WriteTimeout(_timeout_text(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        self._sock.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        tls = _SyncStream(self._sock).start_tls(
            ssl_context, server_hostname, self._bounded(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(tls.get_extra_info("socket"))

    def get_extra_info(self, info: str):
        return _SyncStream(self._sock).get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    """``httpcore.SyncBackend`` whose connections honour the thread's delivery deadline."""

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        left = _DeadlineStream._bounded(timeout, httpcore.ConnectTimeout)
        try:
            stream = super().connect_tcp(host, port, left, local_address, socket_options)
        except httpcore.ConnectTimeout as exc:
            raise httpcore.ConnectTimeout(_timeout_text(exc)) from exc
        return _DeadlineStream(stream.get_extra_info("socket"))


_client: httpx.Client | None = None
_client_pid: int | None = None
_client_lock = threading.Lock()


def _new_client() -> httpx.Client:
    """A pooled, thread-safe client whose connections honour the delivery deadline."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    transport = httpx.HTTPTransport(limits=limits, trust_env=False)
    # httpx has no public hook for the network backend: swap the transport's
    # connection pool for one built like it but with the deadline backend
    # (tests/test_queue_delivery.py checks the deadline end to end).
    transport._pool.close()
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=False,
        network_backend=_DeadlineBackend(),
    )
    return httpx.Client(transport=transport, follow_redirects=False, trust_env=False)


def _http_client() -> httpx.Client:
    """One pooled, thread-safe client per process (re-created after a fork).

    httpcore sets ``TCP_NODELAY`` on every connection: h11 writes the headers
    and the body separately, and with Nagle's algorithm the body would wait
    for the peer's delayed ACK (~40 ms per delivery).
    """
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        with _client_lock:
            if _client is None or _client_pid != os.getpid():
                _client = _new_client()
                _client_pid = os.getpid()
    return _client


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


def _read_capped(response: httpx.Response, cap: int) -> bytes | None:
    """The body if it fits in ``cap`` bytes, else None."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


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
    peer's pace; exceeding it is a transport error. Never raises.
    """
    timeout_ms = config.delivery_timeout_ms() if timeout_ms is None else timeout_ms
    secret = config.callback_secret() if callback_secret is None else callback_secret
    started = time.monotonic()
    _deadline.at, _deadline.ms = started + timeout_ms / 1000.0, timeout_ms
    try:
        headers = {
            "content-type": b"application/json",
            "x-vqs-queue-name": _header(row.queue_name),
            "x-vqs-message-id": _header(row.message_id),
            "x-vqs-message-attempt": str(row.attempt + 1).encode(),
        }
        if secret:
            headers["x-workflow-callback-secret"] = _header(secret)
        url = delivery_url(row.target_base_url, row.pathname)
        timeout = httpx.Timeout(timeout_ms / 1000.0)
        with _http_client().stream("POST", url, content=_utf8(row.body), headers=headers, timeout=timeout) as resp:
            if (time.monotonic() - started) * 1000 > timeout_ms:
                raise TimeoutError(f"delivery exceeded {timeout_ms} ms")
            status = resp.status_code
            body = None
            if status == 503:
                try:
                    body = _read_capped(resp, _MAX_503_BODY)
                except httpx.HTTPError:
                    body = None  # an unreadable (or too slow) body is "not JSON": a counted retry
            else:
                length = resp.headers.get("content-length", "")
                if length.isdigit() and int(length) <= _MAX_DRAIN_BODY:
                    try:
                        resp.read()
                    except httpx.HTTPError:
                        pass  # decided by the status line already
            return classify(status, body)
    except Exception as exc:  # noqa: BLE001 - every failure before an answer is a transport error
        return _transport_error(exc)
    finally:
        _deadline.at = None


# --------------------------------------------------------------------------- one delivery


def deliver_claim(
    claim: Claim, *, claim_next: bool | int | Callable[[], bool | int] = False
) -> DeliveryReport | None:
    """Deliver one claimed message and apply the outcome; None if the claim was not ours to deliver.

    With ``claim_next`` (or when ``claim_next()`` says so once the answer is
    in) the outcome transaction also claims what the freed in-flight slot
    allows — at most ``n`` when it is an integer — and returns those claims
    in ``report.next_claims`` for the caller to deliver; otherwise (False,
    0) the cell's driver is woken on commit.
    Database errors while applying the outcome propagate (the claim then
    stays in flight and is recovered after its deadline, §7.7).
    """
    row = machine.start_delivery(claim)
    if row is None:
        log.info("queue cell %s: claim of %s is no longer current; not delivering", claim.cell_name, claim.message_id)
        return None
    started = time.monotonic()
    outcome = post_message(row)
    elapsed_ms = (time.monotonic() - started) * 1000
    want_next = claim_next() if callable(claim_next) else claim_next
    result = machine.apply_outcome(
        claim,
        row,
        outcome.kind,
        status=outcome.status,
        reason=outcome.reason,
        timeout_seconds=outcome.timeout_seconds,
        claim_next=want_next,
    )
    next_claims: list[Claim] = []
    if want_next:
        result, next_claims = result
    if result == "stale":
        log.warning(
            "queue cell %s: outcome of %s (%s) arrived after its claim was recovered or the message "
            "was acked; ignored",
            claim.cell_name, claim.message_id, outcome.status or outcome.reason,
        )
    return DeliveryReport(claim, row.attempt + 1, outcome, result, elapsed_ms, tuple(next_claims))


def deliver_and_claim_next(
    claim: Claim, should_claim: Callable[[], bool | int] | None = None
) -> tuple[DeliveryReport | None, list[Claim]]:
    """Deliver ``claim``; its outcome transaction also refills the freed in-flight slot (§7.4, §12 A14).

    The worker that freed a slot claims the next due message itself instead
    of sending a wake-up through the broker, so a busy cell keeps its slots
    full without a round trip. ``should_claim()`` (checked once the answer is
    in) returning False skips that — a stopping pump claims nothing new —
    and returning an integer caps the claims (the pump's idle threads).
    Returns the report and the new claims (committed) for the caller to deliver.
    """
    report = deliver_claim(claim, claim_next=should_claim if should_claim is not None else True)
    return report, list(report.next_claims) if report is not None else []
