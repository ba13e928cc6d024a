"""Slow clients cannot starve the API (docs/http-servers.md "Slow clients").

64 connections drip header bytes at the production API server (waitress, started as
README.md says) and stay open while ``/v1/health`` is probed on fresh connections:
each probe must be answered within 100 ms. Loopback only, bounded in time.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from tests.rpc.rawhttp import Reader, connect, request_head
from worldcell import rpc

pytestmark = [pytest.mark.any_database, pytest.mark.slow, pytest.mark.timeout(60)]

SLOW_CLIENTS = 64
PROBES = 8
LIMIT_MS = 100


@contextlib.contextmanager
def dripping(port: int, n: int, every_s: float = 0.05):
    """Hold ``n`` connections that send a request head one byte per ``every_s`` and never finish it.

    Yields a dict with ``sockets`` (still open) and ``errors`` (send failures: the server hung up).
    """
    socks = [connect(port, timeout_s=5) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    state = {"sockets": socks, "errors": 0, "bytes": 0}
    stop = threading.Event()

    def drip():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"a")
                    state["bytes"] += 1
                except OSError:
                    state["errors"] += 1
            stop.wait(every_s)

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(5)
        for s in socks:
            s.close()


def probe_health_ms(port: int) -> float:
    """Milliseconds from connect to the complete ``/v1/health`` answer on a new connection."""
    start = time.perf_counter()
    with connect(port, timeout_s=5) as sock:
        sock.sendall(request_head("GET", "/v1/health", None))
        resp = Reader(sock).read_response()
    elapsed = (time.perf_counter() - start) * 1000
    assert resp is not None and (resp.status, resp.body) == (200, rpc.HEALTH_BODY)
    return elapsed


def probes_under_slow_clients(port: int, n_slow: int = SLOW_CLIENTS, samples: int = PROBES) -> list[float]:
    """Health latencies (ms) measured while ``n_slow`` dripping connections are held open."""
    try:
        probe_health_ms(port)  # the first request of a process pays for imports
    except socket.timeout:
        pass
    with dripping(port, n_slow) as state:
        time.sleep(0.5)  # every slow connection has been accepted and is mid-header
        latencies = []
        for _ in range(samples):
            try:
                latencies.append(probe_health_ms(port))
            except socket.timeout:
                latencies.append(5000.0)
            time.sleep(0.05)
        assert state["errors"] == 0, "the server hung up on slow clients during the probes"
        assert state["bytes"] >= n_slow * 10
    return latencies


def test_health_answers_within_100_ms_while_64_clients_drip_headers(production_server):
    latencies = probes_under_slow_clients(production_server.port)
    assert max(latencies) < LIMIT_MS, [round(x, 1) for x in latencies]


def test_gunicorn_behind_the_contrib_nginx_front_also_holds(gunicorn_behind_nginx):
    """The documented gunicorn option: nginx buffers each request whole before gunicorn sees it."""
    latencies = probes_under_slow_clients(gunicorn_behind_nginx.port)
    assert max(latencies) < LIMIT_MS, [round(x, 1) for x in latencies]
