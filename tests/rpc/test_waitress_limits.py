"""waitress's own limits as README.md starts it (docs/http-servers.md "waitress limits"): a body far
over the protocol's 32 MiB cap is refused from its Content-Length before it is spooled, and a
client that stalls in the middle of a body loses its connection after ``--channel-timeout``.
"""
from __future__ import annotations

import socket
import time

import pytest

from tests.e2e.fleet_processes import readme_api_command
from tests.rpc.rawhttp import Reader, connect, request_head
from worldcell import rpc

pytestmark = [pytest.mark.any_database, pytest.mark.slow, pytest.mark.timeout(180)]


def _flag(name: str) -> int:
    argv = readme_api_command("waitress", 8787)
    assert name in argv, f"README.md's waitress command has no {name}"
    return int(argv[argv.index(name) + 1])


def test_the_body_cap_sits_just_above_the_protocols():
    """Up to it our own JSON 413 answers (tests/rpc/test_real_servers.py); past it waitress's."""
    assert rpc.MAX_BODY_BYTES < _flag("--max-request-body-size") <= rpc.MAX_BODY_BYTES + (4 << 20)


def test_a_100_mb_body_is_refused_before_it_is_sent(production_server):
    server = production_server
    head = request_head("POST", "/v1/rpc/runs/wrun_big/getRun", server.secret, f"Content-Length: {100 << 20}")
    with connect(server.port, timeout_s=10) as sock:
        started = time.monotonic()
        sock.sendall(head + b"[")
        resp = Reader(sock).read_response()
    assert resp is not None and resp.status == 413, resp
    assert time.monotonic() - started < 5


@pytest.mark.slow(reason="waits out README's 30 s --channel-timeout")
def test_a_stalled_body_loses_its_connection_after_the_channel_timeout(production_server):
    server = production_server
    limit_s = _flag("--channel-timeout") + _flag("--cleanup-interval")
    assert limit_s <= 60
    head = request_head("POST", "/v1/rpc/runs/wrun_stall/getRun", server.secret, "Content-Length: 1000")
    with connect(server.port, timeout_s=limit_s + 10) as sock:
        sock.sendall(head + b"[")
        started = time.monotonic()
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            data = None
        waited = time.monotonic() - started
    assert data in (b"", None)  # closed (or reset) by waitress, nothing answered
    assert waited < limit_s + 5, waited
