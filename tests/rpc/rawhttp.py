"""Raw-socket HTTP/1.1 for tests that send what no well-behaved client would (loopback only).

``exchange(port, data, half_close=…)`` writes ``data`` and returns the parsed
responses; ``read_response(sock)`` parses one response (status, headers, body)
or returns None when the server closed the connection without answering.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Reader:
    """Buffers one connection's bytes; ``read_response`` consumes one response at a time."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_response(self, head_request: bool = False) -> Response | None:
        """One response; None if the connection closed first. Raises socket.timeout."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if head_request or status in (100, 204, 304):
            return Response(status, headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                while b"\r\n" not in self.buf:
                    if not self._fill():
                        return None
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    if not self._fill():
                        return None
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    return Response(status, headers, bytes(body))
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n and self._fill():
                pass
            body, self.buf = self.buf[:n], self.buf[n:]
        else:  # close-delimited
            while self._fill():
                pass
            body, self.buf = self.buf, b""
        return Response(status, headers, body)


def connect(port: int, timeout_s: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def exchange(port: int, data: bytes, half_close: bool = True, timeout_s: float = 10) -> Response | None:
    """Send ``data`` on a new connection (then shut down writing if ``half_close``); read one response."""
    with connect(port, timeout_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return Reader(sock).read_response()


def request_head(method: str, target: str, secret: str | None, *headers: str) -> bytes:
    """The request line and headers (ending with the blank line) as bytes."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if secret:
        lines.append(f"Authorization: Bearer {secret}")
    lines.extend(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(body: bytes, size: int = 1 << 16) -> bytes:
    """``body`` in valid chunked framing, with the terminating zero chunk."""
    out = bytearray()
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return bytes(out + b"0\r\n\r\n")
