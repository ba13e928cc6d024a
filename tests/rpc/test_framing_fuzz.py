"""Route fuzz through the real servers: an enqueue body in random chunked or Content-Length
framing, cut at a random byte before its end or sent whole (docs/http-servers.md "Broken framing").

Property: a whole body is stored once and answered 200; a cut one is answered 400 (JSON when
the app saw it) or dropped unanswered, never 200 or 500, and leaves nothing stored.
"""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from tests.queueing.support import enqueue_request
from tests.rpc.rawhttp import exchange, request_head
from worldcell import codec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_ids = itertools.count()


def framed(body: bytes, sizes: list[int], chunked: bool) -> tuple[tuple[str, ...], bytes, int]:
    """(headers, wire bytes, offset just past the last body byte) of ``body`` in the given framing."""
    if not chunked:
        return (f"Content-Length: {len(body)}",), body, len(body)
    wire, pos, end = bytearray(), 0, 0
    for size in itertools.cycle(sizes):
        if pos >= len(body):
            break
        part = body[pos:pos + size]
        wire += f"{len(part):x}\r\n".encode() + part
        end = len(wire)
        wire += b"\r\n"
        pos += len(part)
    return ("Transfer-Encoding: chunked",), bytes(wire + b"0\r\n\r\n"), end


@hsettings(max_examples=25, deadline=None)
@given(chunked=st.booleans(), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       cut=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)))
def test_a_cut_body_is_never_stored_and_a_whole_one_is_stored_once(server, chunked, sizes, cut):
    n = next(_ids)
    name, message_id = f"q:fuzz-{n}", f"msg_fuzz_{n}"
    body = codec.encode([enqueue_request(messageId=message_id)]).encode()
    headers, wire, end = framed(body, sizes, chunked)
    head = request_head("POST", f"/v1/rpc/queue/q%3Afuzz-{n}/enqueue", server.secret, *headers)
    if cut is None:
        resp = exchange(server.port, head + wire, half_close=False)
        assert resp is not None and resp.status == 200, resp
        assert json.loads(resp.body) == {"ok": True, "messageId": message_id, "deduped": False}
        assert server.call("queue", name, "stats")[1]["pending"] == 1
        return
    resp = exchange(server.port, head + wire[:int(cut * end)], half_close=True)
    if resp is not None:
        assert resp.status == 400, resp
        if resp.headers.get("content-type") == "application/json":
            assert json.loads(resp.body)["error"]["name"] == "BadRequest"
    if server.kind == "gunicorn":
        assert resp is not None, "gunicorn hands the app the cut body: rpc.py must answer"
    assert server.call("queue", name, "stats")[1] == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}
