"""Streams and run stream registries are keyed by tenant (docs/tenants.md): the same stream names
and registries in two tenants are two different cells, through the RPC route with each tenant's
own secret (both databases)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_the_same_stream_in_two_tenants_is_two_streams(two_tenants):
    mine, theirs = two_tenants
    assert mine.ok("streams", "stream:out", "writeChunk", b"a") == 0
    assert mine.ok("streams", "stream:out", "writeChunk", b"b") == 1
    assert theirs.ok("streams", "stream:out", "getInfo") == {"tailIndex": -1, "done": False}
    assert theirs.ok("streams", "stream:out", "getChunks", {"startIndex": 0})["chunks"] == []
    assert theirs.ok("streams", "stream:out", "writeChunk", b"x") == 0  # its own dense indexes
    theirs.ok("streams", "stream:out", "closeStream")
    # closing it there neither closes nor shows here
    assert mine.ok("streams", "stream:out", "getInfo") == {"tailIndex": 1, "done": False}
    assert mine.ok("streams", "stream:out", "writeChunk", b"c") == 2
    assert [bytes(c) for c in mine.ok("streams", "stream:out", "getChunks", {"startIndex": 0})["chunks"]] == [b"a", b"b", b"c"]
    assert [bytes(c) for c in theirs.ok("streams", "stream:out", "getChunks", {"startIndex": 0})["chunks"]] == [b"x"]
    status, body = theirs("streams", "stream:out", "writeChunk", b"y")
    assert status == 500 and body["error"]["message"] == "Cannot write to a closed stream"


def test_a_run_registry_lists_only_its_tenants_streams(two_tenants):
    mine, theirs = two_tenants
    mine.ok("streams", "run-streams:wrun_1", "registerStream", "mine")
    theirs.ok("streams", "run-streams:wrun_1", "registerStream", "theirs")
    theirs.ok("streams", "run-streams:wrun_1", "registerStream", "mine")
    assert mine.ok("streams", "run-streams:wrun_1", "listStreams") == ["mine"]
    assert theirs.ok("streams", "run-streams:wrun_1", "listStreams") == ["mine", "theirs"]
