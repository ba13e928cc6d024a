"""The RPC route through the real API servers (waitress and gunicorn, as README.md starts them):
broken body framing, raw request targets, HEAD, ``Expect: 100-continue``, pipelining and
the 32 MiB cap on a chunked body (docs/protocol.md §2.2, §2.7, §2.9; docs/http-servers.md).

Raw sockets on loopback send what the JS client never would; every case then checks
over a well-formed request that nothing was written.
"""
from __future__ import annotations

import json
import threading

import pytest

from tests.queueing.support import enqueue_request
from tests.conftest import encode_component
from tests.rpc.rawhttp import Reader, chunked, connect, exchange, request_head
from worldcell import codec, rpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def enqueue_target(name: str) -> str:
    return f"/v1/rpc/queue/{encode_component(name)}/enqueue"


def framings(body: bytes) -> dict[str, tuple[tuple[str, ...], bytes]]:
    """Broken framings of ``body``: case -> (extra headers, bytes sent after the head).

    The cases in INCOMPLETE end early and are followed by a half-close; the others are
    misframed but end where their framing says, with the connection left open."""
    half = len(body) // 2
    te = ("Transfer-Encoding: chunked",)
    return {
        "bad_chunk_size": (te, b"zz\r\n" + body + b"\r\n0\r\n\r\n"),
        "bad_second_chunk_size": (te, f"{half:x}\r\n".encode() + body[:half] + b"\r\nzz\r\n" + body[half:] + b"\r\n0\r\n\r\n"),
        "chunk_without_crlf": (te, f"{len(body):x}\r\n".encode() + body + b"XX0\r\n\r\n"),
        "truncated_last_chunk": (te, f"{half:x}\r\n".encode() + body[:half] + b"\r\n"
                                 + f"{len(body) - half:x}\r\n".encode() + body[half:-3]),
        "missing_zero_chunk": (te, f"{len(body):x}\r\n".encode() + body + b"\r\n"),
        "short_content_length": ((f"Content-Length: {len(body)}",), body[:-3]),
    }


CASES = list(framings(b"[]"))
INCOMPLETE = {"truncated_last_chunk", "missing_zero_chunk", "short_content_length"}
# gunicorn hands the app a stream that raises or comes up short: rpc.py answers 400 JSON.
# waitress and nginx parse the whole request before the app sees it: a misframed one gets
# their own 400 (waitress: text/plain; nginx: the contrib config's JSON error), and an
# incomplete one followed by a half-close is dropped unanswered, never forwarded.


@pytest.mark.parametrize("case", CASES)
def test_a_body_cut_or_misframed_is_refused_and_nothing_is_stored(server, case):
    name = f"q:frame-{case}"
    message_id = f"msg_cut_{case}"
    body = codec.encode([enqueue_request(messageId=message_id)]).encode()
    headers, rest = framings(body)[case]
    resp = exchange(server.port, request_head("POST", enqueue_target(name), server.secret, *headers) + rest,
                    half_close=case in INCOMPLETE)

    if server.kind == "gunicorn":
        assert resp is not None and resp.status == 400, resp
        assert resp.headers["content-type"] == "application/json"
        err = json.loads(resp.body)["error"]
        assert err["name"] == "BadRequest" and err["message"].startswith("unreadable request body"), err
    elif case in INCOMPLETE:
        assert resp is None, resp
    else:
        assert resp is not None and resp.status == 400, resp
        if server.kind == "nginx":
            assert json.loads(resp.body) == {"error": {"name": "BadRequest", "message": "malformed HTTP request"}}

    assert server.call("queue", name, "stats")[1] == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}
    status, result = server.call("queue", name, "enqueue", enqueue_request(messageId=message_id))
    assert (status, result) == (200, {"ok": True, "messageId": message_id, "deduped": False})
    assert server.call("queue", name, "stats")[1]["pending"] == 1


def test_a_well_framed_chunked_body_is_accepted(server):
    name = "q:frame-ok"
    body = codec.encode([enqueue_request(messageId="msg_chunked_ok")]).encode()
    head = request_head("POST", enqueue_target(name), server.secret, "Transfer-Encoding: chunked")
    resp = exchange(server.port, head + chunked(body, size=7), half_close=False)
    assert resp is not None and resp.status == 200, resp
    assert json.loads(resp.body) == {"ok": True, "messageId": "msg_chunked_ok", "deduped": False}


@pytest.mark.parametrize("name", ["q:a/b", "q:a%2Fb", "q:a%b", "q:a b", "q:\u2713\U0001F600", "q:a+b?c#d"])
def test_cell_names_with_reserved_characters_reach_their_own_cell(server, name):
    message_id = f"msg_name_{encode_component(name)}"
    assert server.call("queue", name, "enqueue", enqueue_request(messageId=message_id)) == (
        200, {"ok": True, "messageId": message_id, "deduped": False})
    assert server.call("queue", name, "stats")[1]["pending"] == 1
    assert server.call("queue", name + "-other", "stats")[1]["pending"] == 0


def test_head_answers_without_a_body_and_the_connection_stays_in_sync(server):
    with connect(server.port) as sock:
        reader = Reader(sock)
        sock.sendall(request_head("HEAD", "/v1/health", None))
        head = reader.read_response(head_request=True)
        assert head.status == 200
        sock.sendall(request_head("GET", "/v1/health", None))
        get = reader.read_response()
        assert (get.status, get.body) == (200, rpc.HEALTH_BODY)


def test_pipelined_requests_are_answered_in_order(production_server):
    """waitress answers pipelined requests in order. gunicorn 23's gthread worker does not:
    it parses the first request and then waits for the socket to become readable again
    while the rest sit in its buffer (docs/http-servers.md)."""
    server = production_server
    stats = codec.encode([]).encode()
    data = (request_head("GET", "/v1/health", None)
            + request_head("POST", "/v1/rpc/queue/q%3Apipe/stats", server.secret, f"Content-Length: {len(stats)}")
            + stats
            + request_head("POST", "/v1/rpc/queue/q%3Apipe/nope", server.secret, "Content-Length: 2") + b"[]"
            + request_head("GET", "/v1/health", None))
    with connect(server.port) as sock:
        sock.sendall(data)
        reader = Reader(sock)
        got = [reader.read_response() for _ in range(4)]
    assert [r.status for r in got] == [200, 200, 404, 200]
    assert got[0].body == got[3].body == rpc.HEALTH_BODY
    assert json.loads(got[1].body)["pending"] == 0


def test_expect_100_continue_gets_the_interim_response_before_the_body(server):
    body = codec.encode([]).encode()
    with connect(server.port, timeout_s=5) as sock:
        reader = Reader(sock)
        sock.sendall(request_head("POST", "/v1/rpc/queue/q%3Aexpect/stats", server.secret,
                                  f"Content-Length: {len(body)}", "Expect: 100-continue"))
        interim = reader.read_response()
        assert interim.status == 100
        sock.sendall(body)
        final = reader.read_response()
    assert final.status == 200 and json.loads(final.body)["pending"] == 0


def test_a_chunked_body_over_32_mib_answers_413_json(server):
    head = request_head("POST", "/v1/rpc/runs/wrun_cap/getRun", server.secret, "Transfer-Encoding: chunked")
    body = b"[" + b" " * rpc.MAX_BODY_BYTES + b"]"  # one byte over the cap
    with connect(server.port, timeout_s=60) as sock:
        def send():
            try:
                sock.sendall(head + chunked(body, size=1 << 20))
            except OSError:
                pass  # the server may answer and close before it has read everything

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        resp = Reader(sock).read_response()
        sender.join(30)
    assert resp is not None and resp.status == 413, resp
    assert resp.body == b'{"error":{"name":"PayloadTooLarge","message":"body exceeds 33554432 bytes"}}'
