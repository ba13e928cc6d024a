"""Test tooling for the queue cells (the Python counterpart of docs/protocol.md §9.3's testing bundle).

Used by ``tests/queueing/`` and ``tests/admin/`` (their conftests register the fixtures below).

* ``HttpSink`` — a real HTTP application on 127.0.0.1 (ephemeral port) that
  records every delivery and answers from a script; it can hold deliveries
  open until released (to observe concurrency).
* ``VirtualClock`` — a controllable clock installed with ``worldcell.clock.set_clock``.
* ``tick(clock, advance_ms)`` — advance the clock (at least 1 ms), fire every
  due alarm and run the claimed deliveries to completion in the calling
  thread: upstream's ``advance`` + ``fireDueAlarms`` + ``settle``.
* ``enqueue_request(**over)`` — the wire ``enqueue`` request the upstream tests use.
* ``DripServer`` — a raw TCP peer that reads a request and answers one byte
  at a time (a slow-drip target, to check the delivery deadline).
* fixtures ``vclock`` (an installed ``VirtualClock``), ``sink`` (an
  ``HttpSink``, closed afterwards) and ``no_broker`` (the in-process driver:
  ``WORLDCELL_USE_CELERY = False``).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from queueing import delivery, machine
from tests.services import wait_until  # noqa: F401  (re-exported for the queue and admin tests)
from worldcell import clock as wc_clock

log = logging.getLogger("tests.queueing.support")

__all__ = [
    "DEADLINE_MS", "HANG_UP", "Answer", "DripServer", "HttpSink", "Recorded", "read_request", "VirtualClock", "enqueue_request", "tick",
    "no_broker", "sink", "vclock", "wait_until",
]


#: ``Answer(HANG_UP)`` closes the connection without answering (a transport error).
HANG_UP = 0


@dataclass(frozen=True)
class Answer:
    """A scripted HTTP answer: ``status``, body (bytes, str or JSON-able), extra headers."""

    status: int = 200
    body: Any = b'{"ok":true}'
    headers: dict[str, str] = field(default_factory=dict)

    def body_bytes(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


@dataclass(frozen=True)
class Recorded:
    """One request the sink received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def message_id(self) -> str | None:
        return self.headers.get("x-vqs-message-id")

    @property
    def attempt(self) -> str | None:
        return self.headers.get("x-vqs-message-attempt")


class HttpSink:
    """An HTTP app that records deliveries and answers them from a script.

    ``answer(*answers)`` sets the answers used in order (the last one repeats);
    ``script(fn)`` sets ``fn(recorded) -> Answer`` instead. ``hold()`` keeps
    every request open until ``release()``. ``requests`` lists what arrived;
    ``peak`` is the highest number of requests open at once.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self._answers: list[Answer] = [Answer()]
        self._script: Callable[[Recorded], Answer] | None = None
        self._gate = threading.Event()
        self._gate.set()
        self.open = 0
        self.peak = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # headers and body go out in separate writes: without this,
                # Nagle + delayed ACK add ~40 ms to every answer
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                rec = Recorded(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()
                )
                with sink.lock:
                    sink.requests.append(rec)
                    sink.open += 1
                    sink.peak = max(sink.peak, sink.open)
                try:
                    sink._gate.wait(30)
                    answer = sink._next_answer(rec)
                    if answer.status == HANG_UP:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    data = answer.body_bytes()
                    self.send_response(answer.status)
                    self.send_header("content-type", "application/json")
                    for k, v in answer.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with sink.lock:
                        sink.open -= 1

            do_GET = do_POST

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # hang-ups are deliberate

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="http-sink", daemon=True
        )
        self._thread.start()

    def _next_answer(self, rec: Recorded) -> Answer:
        with self.lock:
            if self._script is not None:
                script = self._script
            else:
                script = None
                answer = self._answers[0] if len(self._answers) == 1 else self._answers.pop(0)
        return script(rec) if script is not None else answer

    def answer(self, *answers: Answer | int) -> None:
        """Answer with these, in order; the last one repeats."""
        with self.lock:
            self._script = None
            self._answers = [a if isinstance(a, Answer) else Answer(a) for a in answers] or [Answer()]

    def script(self, fn: Callable[[Recorded], Answer]) -> None:
        """Answer each request with ``fn(recorded)`` (called on the server thread)."""
        with self.lock:
            self._script = fn

    def hold(self) -> None:
        """Keep every request open until ``release()``."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def count(self, message_id: str | None = None) -> int:
        with self.lock:
            return sum(1 for r in self.requests if message_id is None or r.message_id == message_id)

    def wait_for(self, n: int, timeout_s: float = 10.0) -> bool:
        """Wait until at least ``n`` requests arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count() >= n:
                return True
            time.sleep(0.005)
        return self.count() >= n

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def read_request(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """Read one HTTP/1.1 request with a ``Content-Length`` body from ``conn`` (``buf``: bytes already read).

    Returns ``(head, body, the bytes after it)``, or None when the peer closed before a whole head.
    """
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head, rest[:length], rest[length:]


class DripServer:
    """A peer that reads each HTTP request, then sends ``response`` one byte every ``interval_s``.

    ``head_fast=True`` sends everything up to the blank line at once and drips
    only the body. ``url`` is the base URL; ``connections`` counts accepted
    connections; ``close()`` stops it (open drips end at their next byte).
    """

    def __init__(self, response: bytes, interval_s: float = 0.1, *, head_fast: bool = False):
        self.response = response
        self.interval_s = interval_s
        self.head_fast = head_fast
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, name="drip-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(10)
                if read_request(conn, b"") is None:
                    return
                out = self.response
                if self.head_fast:
                    head_end = out.index(b"\r\n\r\n") + 4
                    conn.sendall(out[:head_end])
                    out = out[head_end:]
                for i in range(len(out)):
                    if self._stop.wait(self.interval_s):
                        return
                    conn.sendall(out[i : i + 1])
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2)


class VirtualClock:
    """A clock that moves only when told: ``advance(ms)``; ``install()`` / ``uninstall()``."""

    def __init__(self, start_ms: int = 1_767_323_045_678):
        self.now = start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        with self._lock:
            self.now += ms
            return self.now

    def install(self) -> "VirtualClock":
        wc_clock.set_clock(self)
        return self

    def uninstall(self) -> None:
        wc_clock.set_clock(None)


def tick(vclock: VirtualClock, advance_ms: int = 0) -> list[delivery.DeliveryReport | Exception | None]:
    """Advance ``vclock`` by ``max(1, advance_ms)``, fire due alarms, deliver every claim here.

    Returns one entry per claim: the delivery report, None (claim skipped),
    or the exception a delivery raised (logged, as the real drivers do).
    """
    vclock.advance(max(1, advance_ms))
    results: list[delivery.DeliveryReport | Exception | None] = []
    for claim in machine.fire_due_alarms():
        try:
            results.append(delivery.deliver_claim(claim))
        except Exception as exc:  # noqa: BLE001 - mirrors the drivers: log and go on
            log.exception("queue cell %s: delivery of %s failed", claim.cell_name, claim.message_id)
            results.append(exc)
    return results


#: the protocol's claim deadline, timeout + 30 000 ms (docs/protocol.md §7.4)
DEADLINE_MS = 300_000 + 30_000


def enqueue_request(**over: Any) -> dict[str, Any]:
    """The wire ``enqueue`` request of the upstream queue tests, with ``over`` applied.

    Defaults: queue ``__wkf_step_test``, pathname ``step``, body
    ``{"data":"payload"}``, config ``{targetBaseUrl: http://app.test:3000, queueShards: 1}``.
    ``target=`` / ``shards=`` set the config members.
    """
    target = over.pop("target", "http://app.test:3000")
    shards = over.pop("shards", 1)
    req: dict[str, Any] = {
        "messageId": over.pop("messageId", f"msg_{time.time_ns()}"),
        "queueName": "__wkf_step_test",
        "pathname": "step",
        "body": '{"data":"payload"}',
        "config": {"targetBaseUrl": target, "queueShards": shards},
    }
    req.update(over)
    return req


@pytest.fixture
def no_broker(settings):
    """Deliver in-process (``tick`` / the pump), never through Celery."""
    settings.WORLDCELL_USE_CELERY = False


@pytest.fixture
def vclock():
    """A ``VirtualClock`` installed as the server clock for the test."""
    c = VirtualClock().install()
    yield c
    c.uninstall()


@pytest.fixture
def sink():
    """An ``HttpSink`` on 127.0.0.1, closed after the test."""
    s = HttpSink()
    yield s
    s.close()
