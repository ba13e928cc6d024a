"""The delivery HTTP client (``queueing.httpclient``): keep-alive pooling, stale connections,
chunked answers, header safety, quick ACKs and the total deadline (docs/protocol.md §7.5)."""
from __future__ import annotations

import socket
import statistics
import threading
import time

import pytest

from queueing import httpclient
from queueing.delivery import post_message
from queueing.machine import DeliveryRow
from .support import DripServer, read_request


class RawServer:
    """Accepts connections and answers every request with ``answer(n)`` bytes (n = request number).

    ``split`` sends the status line + headers and the body in two writes
    without TCP_NODELAY (like Python's ``http.server``). ``close_after``
    closes each connection after that many answers.
    """

    def __init__(self, answer, *, split: bool = False, close_after: int | None = None):
        self.answer = answer
        self.split = split
        self.close_after = close_after
        self.accepted = 0
        self.requests: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        with conn:
            conn.settimeout(5)
            buf = b""
            served = 0
            try:
                while True:
                    request = read_request(conn, buf)
                    if request is None:
                        return
                    head, body, buf = request
                    self.requests.append(head + b"\r\n\r\n" + body)
                    data = self.answer(len(self.requests))
                    if self.split:
                        head_end = data.index(b"\r\n\r\n") + 4
                        conn.sendall(data[:head_end])
                        conn.sendall(data[head_end:])
                    else:
                        conn.sendall(data)
                    served += 1
                    if self.close_after is not None and served >= self.close_after:
                        return
            except OSError:
                return

    def close(self):
        self._stop.set()
        self._sock.close()


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


def row(target: str, **over) -> DeliveryRow:
    fields = dict(message_id="m", queue_name="__wkf_step_x", pathname="step", body='{"a":1}',
                  target_base_url=target, idempotency_key=None, attempt=0, enqueued_at=0, deliveries=0)
    fields.update(over)
    return DeliveryRow(**fields)


@pytest.fixture(autouse=True)
def fresh_pool():
    httpclient.close_idle_connections()
    yield
    httpclient.close_idle_connections()


def test_it_reuses_one_keep_alive_connection_for_consecutive_deliveries():
    server = RawServer(lambda n: OK)
    try:
        for _ in range(5):
            assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
        assert server.accepted == 1 and len(server.requests) == 5
    finally:
        server.close()


def test_it_sends_the_body_and_headers_byte_exact():
    server = RawServer(lambda n: OK)
    try:
        body = '{"s":"h\u00e9llo \U0001f600","raw":"a\x00b"}'
        post_message(row(server.url + "/base/", body=body, attempt=2), timeout_ms=2000, callback_secret="s3")
        head, _, sent = server.requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /base/.well-known/workflow/v1/step HTTP/1.1"
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        assert headers[b"x-vqs-message-attempt"] == b"3"
        assert headers[b"x-workflow-callback-secret"] == b"s3"
        assert headers[b"content-type"] == b"application/json"
        assert sent == body.encode("utf-8")
    finally:
        server.close()


def test_it_opens_a_new_connection_when_the_peer_closed_the_idle_one():
    server = RawServer(lambda n: OK, close_after=1)
    try:
        assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
        time.sleep(0.1)  # the peer's close arrives while the connection idles in the pool
        assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
        assert server.accepted == 2
    finally:
        server.close()


def test_it_does_not_reuse_a_connection_the_peer_asked_to_close():
    server = RawServer(lambda n: OK.replace(b"content-length", b"connection: close\r\ncontent-length"))
    try:
        for _ in range(3):
            assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
        assert server.accepted == 3
    finally:
        server.close()


def test_it_reads_a_chunked_503_body_for_timeout_seconds():
    chunked = (b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5\r\n{\"tim\r\n11\r\neoutSeconds\":2.5}\r\n0\r\n\r\n")
    server = RawServer(lambda n: chunked)
    try:
        outcome = post_message(row(server.url), timeout_ms=2000)
        assert (outcome.kind, outcome.timeout_seconds) == ("redeliver", 2.5)
        assert post_message(row(server.url), timeout_ms=2000).kind == "redeliver"
        assert server.accepted == 1  # the chunked body was read to its end: the connection was reused
    finally:
        server.close()


def test_it_reuses_the_connection_after_a_chunked_2xx_answer():
    """Nitro answers the workflow routes chunked: drained to the last chunk, the connection is reused."""
    chunked = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
               b"connection: keep-alive\r\n\r\n5\r\n{\"ok\"\r\n6\r\n:true}\r\n0\r\n\r\n")
    server = RawServer(lambda n: chunked, split=True)
    try:
        for _ in range(4):
            assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
        assert server.accepted == 1 and len(server.requests) == 4
    finally:
        server.close()


def test_a_chunked_2xx_whose_body_never_ends_is_acked_within_the_drain_time_and_not_reused():
    endless = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"  # no last chunk
    server = RawServer(lambda n: endless)
    try:
        started = time.monotonic()
        assert post_message(row(server.url), timeout_ms=20_000).kind == "ack"
        assert time.monotonic() - started < 5  # the drain gives up after ~1 s, not at the 20 s deadline
        assert post_message(row(server.url), timeout_ms=20_000).kind == "ack"
        assert server.accepted == 2  # the undrained connection was not pooled
    finally:
        server.close()


def test_it_refuses_header_values_with_line_breaks_without_sending_anything():
    server = RawServer(lambda n: OK)
    try:
        outcome = post_message(row(server.url, queue_name="q\r\nx-evil: 1"), timeout_ms=2000)
        assert outcome.kind == "retry" and outcome.reason.startswith("transport error: ValueError")
        time.sleep(0.05)
        assert server.requests == []
    finally:
        server.close()


def test_it_reports_unsupported_urls_as_transport_errors():
    for target, name in (("ftp://app", "UnsupportedProtocol"), ("app.test:3000", "UnsupportedProtocol"),
                         ("http://127.0.0.1:1", "ConnectError")):
        outcome = post_message(row(target), timeout_ms=1000)
        assert outcome.kind == "retry" and outcome.reason.startswith(f"transport error: {name}"), outcome.reason


def test_it_acknowledges_at_once_so_a_peer_with_nagle_answers_without_the_delayed_ack_pause():
    """A peer writing headers and body separately without TCP_NODELAY would wait ~40 ms for our ACK."""
    server = RawServer(lambda n: OK, split=True)
    try:
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            assert post_message(row(server.url), timeout_ms=2000).kind == "ack"
            times.append(time.perf_counter() - t0)
        assert statistics.median(times) < 0.025, times
    finally:
        server.close()


def test_it_keeps_the_total_deadline_on_a_reused_connection():
    drip = DripServer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", interval_s=0.1)
    try:
        t0 = time.monotonic()
        outcome = post_message(row(drip.url), timeout_ms=300)
        assert outcome.reason.startswith("transport error: ReadTimeout: delivery deadline of 300 ms")
        assert time.monotonic() - t0 < 0.6
    finally:
        drip.close()
