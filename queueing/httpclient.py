"""The delivery HTTP client: one POST, pooled keep-alive connections, a total deadline (docs/protocol.md §7.5).

``post(url, body, headers, timeout_ms, read_body)`` sends one request and
returns ``(status, body or None)``; every failure before a usable answer
raises one of the ``TransportError`` subclasses below, named like httpx's
(``ConnectError``, ``ReadTimeout``, …) because the retry reason quotes the
name (``transport error: ReadTimeout: …``).

Why not httpx: a delivery is the hot loop of the queue worker and httpx's
request/response model, header normalisation and connection-pool bookkeeping
cost about twice the CPU of ``http.client`` for the same POST on the
reference machine. This module keeps to what a delivery needs: HTTP/1.1 over
TCP or TLS, no redirects (a 3xx is an answer, §12 A8), no proxies (as Node's
``fetch``), no content decoding (we never ask for compression).

**The deadline is total.** ``timeout_ms`` bounds the whole request — connect,
send, status line and headers, and the body read — whatever the peer's pace:
every blocking socket operation gets ``min(time left, …)`` as its timeout,
and past the deadline the next operation fails at once
(``ReadTimeout: delivery deadline of N ms exceeded``). A peer that drips one
byte a second therefore cannot hold a delivery thread longer than the
deadline plus one scheduling slice. (Name resolution cannot be bounded this
way; targets are normally IP literals or local names.)

**Quick ACKs.** Before each read the socket asks the kernel to acknowledge
received data at once (Linux ``TCP_QUICKACK``, cleared again by the kernel
after use). An application that writes its status line and headers and then
its body in separate small writes without ``TCP_NODELAY`` (Python's
``http.server``, for one) holds the body back until its headers are
acknowledged (Nagle); with a delayed ACK on our side that adds ~40 ms to
every delivery.

**Pooling.** Connections whose answer was read to the end and that the peer
keeps alive go back to a per-origin pool (last in, first out; at most
``MAX_IDLE_PER_ORIGIN``; dropped after ``IDLE_EXPIRY_S`` idle or when the peer
has closed them — checked without blocking before reuse). An answer with a
``Content-Length`` or a chunked one is drained up to 64 KiB for that, a
chunked one within 1 s after its head; a larger or slower body costs only
the connection. The pool is per process and re-created after a fork.
"""
from __future__ import annotations

import http.client
import os
import re
import select
import socket
import ssl
import threading
import time
from typing import Callable
from urllib.parse import quote, urlsplit

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "TransportError",
    "UnsupportedProtocol",
    "WriteError",
    "WriteTimeout",
    "post",
    "post_answer",
]

MAX_IDLE_PER_ORIGIN = 64
IDLE_EXPIRY_S = 5.0
_SEND_CHUNK = 1 << 16
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class TransportError(Exception):
    """No usable answer: the request failed before (or while) the answer was read."""


class UnsupportedProtocol(TransportError):
    pass


class ConnectError(TransportError):
    pass


class ConnectTimeout(TransportError):
    pass


class ReadError(TransportError):
    pass


class ReadTimeout(TransportError):
    pass


class WriteError(TransportError):
    pass


class WriteTimeout(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


# --------------------------------------------------------------------------- the deadline

_deadline = threading.local()


def _time_left(exc: type[TransportError]) -> float:
    """Seconds left until this thread's deadline; raises ``exc`` once it has passed."""
    left = _deadline.at - time.monotonic()
    if left <= 0:
        raise exc(_deadline_text())
    return left


def _deadline_text() -> str:
    return f"delivery deadline of {_deadline.ms} ms exceeded"


class _DeadlineSocketMixin:
    """Blocking socket operations bounded by the thread's delivery deadline (see the module docstring)."""

    def recv_into(self, buffer, nbytes=0, flags=0):  # noqa: ANN001 - socket signature
        self.settimeout(_time_left(ReadTimeout))
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize, flags=0):  # noqa: ANN001 - socket signature
        self.settimeout(_time_left(ReadTimeout))
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return super().recv(bufsize, flags)

    def sendall(self, data, flags=0):  # noqa: ANN001 - socket signature
        view = memoryview(data).cast("B")
        while view:
            self.settimeout(_time_left(WriteTimeout))
            view = view[self.send(view[:_SEND_CHUNK], flags):]


class _DeadlineSocket(_DeadlineSocketMixin, socket.socket):
    pass


class _DeadlineSSLSocket(_DeadlineSocketMixin, ssl.SSLSocket):
    def recv_into(self, buffer, nbytes=None, flags=0):  # noqa: ANN001 - SSLSocket signature
        self.settimeout(_time_left(ReadTimeout))
        return ssl.SSLSocket.recv_into(self, buffer, nbytes, flags)

    def recv(self, buflen=1024, flags=0):  # noqa: ANN001 - SSLSocket signature
        self.settimeout(_time_left(ReadTimeout))
        return ssl.SSLSocket.recv(self, buflen, flags)


def _connect(scheme: str, host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=_time_left(ConnectTimeout))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = _DeadlineSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    if scheme == "https":
        sock.settimeout(_time_left(ConnectTimeout))  # the handshake
        sock = _tls().wrap_socket(sock, server_hostname=host)
    return sock


_tls_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    global _tls_context
    if _tls_context is None:
        ctx = ssl.create_default_context()
        ctx.sslsocket_class = _DeadlineSSLSocket
        _tls_context = ctx
    return _tls_context


# --------------------------------------------------------------------------- the pool

_Origin = tuple[str, str, int]
_pool: dict[_Origin, list[tuple[socket.socket, float]]] = {}
_pool_pid = os.getpid()
_pool_lock = threading.Lock()


def _checkout(origin: _Origin) -> socket.socket | None:
    """An idle pooled connection to ``origin`` that the peer has not closed, or None."""
    global _pool, _pool_pid
    now = time.monotonic()
    with _pool_lock:
        if _pool_pid != os.getpid():
            _pool, _pool_pid = {}, os.getpid()
        idle = _pool.get(origin)
        while idle:
            sock, since = idle.pop()
            if now - since <= IDLE_EXPIRY_S and not _readable(sock):
                return sock
            sock.close()
    return None


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable was closed (or garbled) by the peer."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _checkin(origin: _Origin, sock: socket.socket) -> None:
    with _pool_lock:
        if _pool_pid == os.getpid():
            idle = _pool.setdefault(origin, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                idle.append((sock, time.monotonic()))
                return
    sock.close()


def close_idle_connections() -> None:
    """Close every pooled connection of this process (tests, shutdown)."""
    with _pool_lock:
        pools = list(_pool.values())
        _pool.clear()
    for idle in pools:
        for sock, _ in idle:
            sock.close()


# --------------------------------------------------------------------------- one request


def post(
    url: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    timeout_ms: int,
    read_body: Callable[[int], int | None] | None = None,
) -> tuple[int, bytes | None]:
    """POST ``body`` to ``url``; ``(status, answer body)`` within ``timeout_ms`` in total (``post_answer``'s first two)."""
    status, data, _ = post_answer(url, body, headers, timeout_ms, read_body)
    return status, data


def post_answer(
    url: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    timeout_ms: int,
    read_body: Callable[[int], int | None] | None = None,
    keep_head: Callable[[int], int] | None = None,
) -> tuple[int, bytes | None, bytes | None]:
    """POST ``body`` to ``url``; ``(status, answer body, answer head)`` within ``timeout_ms`` in total.

    ``headers`` are ``(name, value)`` byte strings sent as given, after
    ``host`` and before ``content-length``; a value with control characters
    raises ``ValueError`` before anything is sent. The answer body is
    returned when ``read_body(status)`` gives a cap and the body fits in it
    (else None; small bodies are still drained so the connection can be
    reused). ``keep_head(status)`` > 0 also returns the answer's first that
    many bytes (for the attempt log; a body longer than ``_MAX_DRAIN`` or of
    unknown length is then read that far and its connection not reused, as
    an undrained one). Raises ``TransportError`` when there is no usable answer.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UnsupportedProtocol(f"Request URL has an unsupported protocol '{parts.scheme}://'.")
    try:
        host = parts.hostname
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise UnsupportedProtocol(f"invalid URL {url[:80]!r}: {exc}") from None
    if not host:
        raise UnsupportedProtocol(f"invalid URL {url[:80]!r}: no host")
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_TARGET_SAFE)
    authority = parts.netloc.rpartition("@")[2]
    head = [f"POST {target} HTTP/1.1".encode("ascii", "strict"), b"host: " + authority.encode("idna")]
    for name, value in headers:
        if _CONTROL.search(value) or _CONTROL.search(name):
            raise ValueError(f"invalid header {name!r}: control characters")
        head.append(name + b": " + value)
    head.append(b"content-length: " + str(len(body)).encode())
    request = b"\r\n".join(head) + b"\r\n\r\n" + body
    origin = (scheme, host, port)

    _deadline.at = time.monotonic() + timeout_ms / 1000.0
    _deadline.ms = timeout_ms
    sock = _checkout(origin)
    keep = False
    phase = "connect"
    try:
        if sock is None:
            sock = _connect(scheme, host, port)
        phase = "write"
        sock.sendall(request)
        phase = "read"
        resp = http.client.HTTPResponse(sock, method="POST")
        resp.begin()
        status = resp.status
        data = head = None
        cap = read_body(status) if read_body is not None else None
        want_head = keep_head(status) if keep_head is not None else 0
        try:
            if cap is not None:
                data = resp.read(cap + 1)
                head = data[:want_head] if want_head > 0 else None
                if len(data) > cap:
                    data = None
            elif resp.length is not None and resp.length <= _MAX_DRAIN:
                rest = resp.read()
                head = rest[:want_head] if want_head > 0 else None
            elif resp.chunked:
                # a chunked answer (Nitro's, for one) is drained to its last chunk so the connection can be
                # reused: at most _MAX_DRAIN bytes, within _CHUNKED_DRAIN_S of the deadline
                _deadline.at = min(_deadline.at, time.monotonic() + _CHUNKED_DRAIN_S)
                rest = resp.read(_MAX_DRAIN + 1)
                head = rest[:want_head] if want_head > 0 else None
            elif want_head > 0:
                head = resp.read(want_head)
        except (OSError, http.client.HTTPException, TransportError):
            data = None  # the status line decides; an unreadable body is "no body"
        keep = resp.isclosed() and not resp.will_close
        return status, data, head
    except TransportError:
        raise
    except socket.timeout as exc:
        left = _deadline.at - time.monotonic()
        text = _deadline_text() if left <= 0 else (str(exc) or "timed out")
        raise {"connect": ConnectTimeout, "write": WriteTimeout}.get(phase, ReadTimeout)(text) from exc
    except http.client.HTTPException as exc:
        raise RemoteProtocolError(_protocol_text(exc)) from exc
    except (OSError, ValueError) as exc:
        raise {"connect": ConnectError, "write": WriteError}.get(phase, ReadError)(str(exc)) from exc
    finally:
        if sock is not None:
            if keep:
                _checkin(origin, sock)
            else:
                sock.close()


_MAX_DRAIN = 64 << 10
#: Seconds a chunked answer's body may take to end once its head has arrived (it is only drained).
_CHUNKED_DRAIN_S = 1.0
#: Characters left as they are in the request target (RFC 3986 pchar, "/", "?", and existing escapes).
_TARGET_SAFE = "/?:@!$&'()*+,;=-._~%"
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def _protocol_text(exc: http.client.HTTPException) -> str:
    if isinstance(exc, http.client.RemoteDisconnected):
        return "Server disconnected without sending a response."
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
