"""The RPC body reader: every way a server's ``wsgi.input`` can fail answers 400 JSON, and no
cell is called (docs/protocol.md §2.2 checks 9-12, §2.9; docs/http-servers.md "Broken framing").

In-process, with ``wsgi.input`` doubles that behave like gunicorn's readers (they raise
``InvalidChunkSize``/``NoMoreData``/``ChunkMissingTerminator`` or return short); the same
cases through the real servers are in test_real_servers.py and test_framing_fuzz.py.
"""
from __future__ import annotations

import io
import json

import pytest
from django.core.handlers.wsgi import WSGIRequest
from django.test import RequestFactory
from gunicorn.http import errors as gerrors

from worldcell import dispatch, rpc

SECRET = "s3cret"


class FailingInput:
    """Hands out ``good`` bytes, then raises ``exc`` (or returns b"" when ``exc`` is None)."""

    def __init__(self, good: bytes, exc: BaseException | None):
        self.data = io.BytesIO(good)
        self.exc = exc

    def read(self, size: int = -1) -> bytes:
        chunk = self.data.read(size)
        if chunk:
            return chunk
        if self.exc is not None:
            raise self.exc
        return b""

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


@pytest.fixture
def calls(monkeypatch, settings):
    settings.WORLD_SECRET = SECRET
    seen = []

    class Probe:
        def __init__(self, name, tenant="default"):
            self.name = name

        def stats(self):
            seen.append(self.name)
            return {"pending": 0}

    monkeypatch.setitem(dispatch._REGISTRY, "queue", dispatch.Binding("queue", Probe, {"stats": "stats"}, {"stats": 0}))
    return seen


def request(stream, **meta):
    """A WSGIRequest as a server builds it, with ``stream`` as ``wsgi.input``."""
    environ = RequestFactory()._base_environ(
        REQUEST_METHOD="POST", PATH_INFO="/v1/rpc/queue/q:0/stats", RAW_URI="/v1/rpc/queue/q%3A0/stats",
        HTTP_AUTHORIZATION=f"Bearer {SECRET}", **meta)
    environ["wsgi.input"] = stream
    if "CONTENT_LENGTH" not in meta:
        environ.pop("CONTENT_LENGTH", None)
    return WSGIRequest(environ)


CHUNKED = {"HTTP_TRANSFER_ENCODING": "chunked"}


@pytest.mark.parametrize("exc", [
    gerrors.InvalidChunkSize(b"zz"), gerrors.NoMoreData(), gerrors.ChunkMissingTerminator(b"XX"),
    gerrors.InvalidHeader("bad trailer"), ConnectionResetError(104, "reset"), TimeoutError("timed out"),
    ValueError("odd reader"),
], ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_a_reader_that_raises_answers_400_json_and_calls_no_cell(calls, exc, framing):
    meta = CHUNKED if framing == "chunked" else {"CONTENT_LENGTH": "10"}
    resp = rpc.handle(request(FailingInput(b"[1,", exc), **meta))
    assert resp.status_code == 400
    assert resp["Content-Type"] == "application/json"
    err = json.loads(resp.content)["error"]
    assert err["name"] == "BadRequest" and err["message"].startswith("unreadable request body: "), err
    assert calls == []


def test_a_body_shorter_than_its_content_length_is_not_processed(calls):
    resp = rpc.handle(request(FailingInput(b"[]", None), CONTENT_LENGTH="20"))
    assert resp.status_code == 400
    assert json.loads(resp.content) == {
        "error": {"name": "BadRequest", "message": "unreadable request body: body ended after 2 of 20 bytes"}}
    assert calls == []


def test_a_complete_body_is_processed(calls):
    assert rpc.handle(request(FailingInput(b"[]", None), CONTENT_LENGTH="2")).content == b'{"pending":0}'
    assert rpc.handle(request(FailingInput(b"[]", None), **CHUNKED)).content == b'{"pending":0}'
    assert calls == ["q:0", "q:0"]


def test_the_cap_still_wins_over_a_later_read_failure(calls):
    stream = FailingInput(b" " * (rpc.MAX_BODY_BYTES + 1), gerrors.NoMoreData())
    resp = rpc.handle(request(stream, **CHUNKED))
    assert resp.status_code == 413 and calls == []


def test_every_answer_carries_its_content_length(calls):
    for resp in (rpc.handle(request(FailingInput(b"[]", None), CONTENT_LENGTH="2")),
                 rpc.handle(request(FailingInput(b"[1,", gerrors.NoMoreData()), **CHUNKED))):
        assert resp["Content-Length"] == str(len(resp.content))
