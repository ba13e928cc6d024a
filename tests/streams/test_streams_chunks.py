"""The chunk role of the streams cell (docs/protocol.md §4.2, §8.2; acceptance §11.1 items 11–12, §11.4 item 27, §11.10)."""
from datetime import datetime, timezone

import pytest

from cells.models import Stream, StreamChunk
from worldcell import codec

pytestmark = pytest.mark.django_db


def write(rpc, name, data):
    return rpc.ok("streams", name, "writeChunk", data)


def chunks(rpc, name, start=0, limit=None):
    params = {"startIndex": start} if limit is None else {"startIndex": start, "limit": limit}
    return rpc.ok("streams", name, "getChunks", params)


def test_it_answers_the_first_write_with_the_body_zero(rpc):
    resp = rpc.call_raw("streams", "stream:x", "writeChunk", b"\x00\x01\x02")
    assert (resp.status_code, resp.content) == (200, b"0")


def test_it_returns_two_writes_in_order_with_the_tail_index(rpc):
    assert write(rpc, "stream:t", b"Hello") == 0
    assert write(rpc, "stream:t", b" world") == 1
    assert chunks(rpc, "stream:t", 0, 10) == {"chunks": [b"Hello", b" world"], "done": False, "tailIndex": 1}


def test_it_keeps_bytes_untouched(rpc):
    write(rpc, "stream:bin", bytes([0, 1, 2, 253, 254, 255]))
    assert chunks(rpc, "stream:bin", 0, 10)["chunks"] == [bytes([0, 1, 2, 253, 254, 255])]


def test_it_counts_an_empty_chunk(rpc):
    assert write(rpc, "stream:e", b"") == 0
    assert rpc.ok("streams", "stream:e", "getInfo") == {"tailIndex": 0, "done": False}
    assert chunks(rpc, "stream:e")["chunks"] == [b""]


def test_it_refuses_writes_after_close_with_the_upstream_error(rpc):
    write(rpc, "stream:c", b"a")
    assert rpc.ok("streams", "stream:c", "closeStream") is None
    assert rpc("streams", "stream:c", "writeChunk", b"b") == (
        500,
        {"error": {"name": "Error", "message": "Cannot write to a closed stream"}},
    )
    assert rpc.ok("streams", "stream:c", "getInfo") == {"tailIndex": 0, "done": True}
    assert StreamChunk.objects.count() == 1


def test_it_closes_an_empty_stream_twice(rpc):
    assert rpc.ok("streams", "stream:y", "closeStream") is None
    assert rpc.ok("streams", "stream:y", "closeStream") is None
    assert rpc.ok("streams", "stream:y", "getInfo") == {"tailIndex": -1, "done": True}
    assert chunks(rpc, "stream:y", 0, 5) == {"chunks": [], "done": True, "tailIndex": -1}
    assert rpc("streams", "stream:y", "writeChunk", b"x")[0] == 500


def test_it_keeps_the_count_when_closing(rpc):
    for part in (b"zero", b"one", b"two"):
        write(rpc, "stream:k", part)
    rpc.ok("streams", "stream:k", "closeStream")
    rpc.ok("streams", "stream:k", "closeStream")
    assert rpc.ok("streams", "stream:k", "getInfo") == {"tailIndex": 2, "done": True}
    assert b"".join(chunks(rpc, "stream:k", 1)["chunks"]) == b"onetwo"
    # the client resolves startIndex -2 through getInfo: max(0, tailIndex + 1 - 2) = 1
    tail = rpc.ok("streams", "stream:k", "getInfo")["tailIndex"]
    assert b"".join(chunks(rpc, "stream:k", max(0, tail + 1 - 2))["chunks"]) == b"onetwo"


def test_it_reports_an_open_stream_with_one_chunk_as_not_done(rpc):
    write(rpc, "stream:open", b"only")
    assert chunks(rpc, "stream:open", 0, 3) == {"chunks": [b"only"], "done": False, "tailIndex": 0}


def test_it_answers_an_unknown_stream_as_empty_and_open(rpc):
    assert rpc.ok("streams", "stream:never", "getInfo") == {"tailIndex": -1, "done": False}
    assert chunks(rpc, "stream:never", 0, 5) == {"chunks": [], "done": False, "tailIndex": -1}
    assert not Stream.objects.exists()


def test_it_pages_from_start_index_with_limit(rpc):
    for i in range(4):
        write(rpc, "stream:x", f"c{i}".encode())
    assert chunks(rpc, "stream:x", 2, 100) == {"chunks": [b"c2", b"c3"], "done": False, "tailIndex": 3}
    assert chunks(rpc, "stream:x", 1, 2)["chunks"] == [b"c1", b"c2"]
    assert chunks(rpc, "stream:x", 0, 0)["chunks"] == []


def test_it_clamps_a_negative_start_index_to_zero(rpc):
    for i in range(4):
        write(rpc, "stream:n", f"c{i}".encode())
    assert chunks(rpc, "stream:n", -3, 2)["chunks"] == [b"c0", b"c1"]


def test_it_answers_a_start_beyond_the_tail_with_no_chunks_and_the_real_tail(rpc):
    for i in range(3):
        write(rpc, "stream:b", b"x")
    assert chunks(rpc, "stream:b", 7, 5) == {"chunks": [], "done": False, "tailIndex": 2}
    assert chunks(rpc, "stream:b", 2**70, 5)["chunks"] == []


def test_it_returns_all_remaining_chunks_without_a_limit(rpc):
    for i in range(5):
        write(rpc, "stream:r", bytes([i]))
    assert chunks(rpc, "stream:r", 1)["chunks"] == [bytes([i]) for i in range(1, 5)]
    page = rpc.ok("streams", "stream:r", "getChunks", {"startIndex": 1, "limit": None})
    assert page["chunks"] == [bytes([i]) for i in range(1, 5)]


def test_it_reads_five_chunks_in_pages_of_two_like_the_client(rpc):
    # §11.10 item 145: the client asks for limit + 1 to learn hasMore.
    for i in range(5):
        write(rpc, "stream:p", bytes([i]))
    rpc.ok("streams", "stream:p", "closeStream")
    page1 = chunks(rpc, "stream:p", 0, 3)
    assert (page1["chunks"], page1["done"]) == ([b"\x00", b"\x01", b"\x02"], True)
    assert chunks(rpc, "stream:p", 2, 3)["chunks"] == [b"\x02", b"\x03", b"\x04"]
    assert chunks(rpc, "stream:p", 4, 3)["chunks"] == [b"\x04"]


@pytest.mark.parametrize(
    "value",
    [
        {"__uint8array": True, "data": [1, 2]},
        "a plain string",
        "",
        None,
        0,
        [1, {"nested": b"\x00"}],
        {"createdAt": datetime(2020, 1, 1, tzinfo=timezone.utc), "note": "2020-01-01T00:00:00Z"},
        "nul \u0000 inside",
    ],
    ids=repr,
)
def test_it_stores_and_echoes_non_bytes_chunks_verbatim(rpc, value):
    write(rpc, "stream:legacy", b"first")
    assert write(rpc, "stream:legacy", value) == 1
    assert chunks(rpc, "stream:legacy", 0, 10)["chunks"] == [b"first", value]


def test_it_echoes_a_legacy_uint8array_object_as_that_object_on_the_wire(rpc):
    legacy = b'[{"__uint8array":true,"data":[1,2]}]'
    assert rpc.raw("/v1/rpc/streams/stream%3Alegacy/writeChunk", legacy).status_code == 200
    resp = rpc.raw("/v1/rpc/streams/stream%3Alegacy/getChunks", b'[{"startIndex":0}]')
    assert resp.content == b'{"chunks":[{"__uint8array":true,"data":[1,2]}],"done":false,"tailIndex":0}'


def test_it_stores_bytes_in_the_binary_column_and_other_values_as_codec_text(rpc):
    write(rpc, "stream:cols", b"\xff")
    write(rpc, "stream:cols", "text")
    rows = list(StreamChunk.objects.order_by("index").values_list("index", "data", "value"))
    assert [(i, bytes(d) if d is not None else None, v) for i, d, v in rows] == [
        (0, b"\xff", None),
        (1, None, codec.encode("text")),
    ]
    stream = Stream.objects.get(name="stream:cols")
    assert (stream.count, stream.closed) == (2, False)


def test_it_round_trips_a_16_mib_chunk(rpc):
    big = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    assert write(rpc, "stream:big", big) == 0
    assert write(rpc, "stream:big", b"tail") == 1
    page = chunks(rpc, "stream:big", 0, 1)
    assert len(page["chunks"]) == 1 and page["chunks"][0] == big
    assert page["tailIndex"] == 1


def test_it_addresses_a_name_with_a_slash_through_its_encoding(rpc):
    resp = rpc.raw("/v1/rpc/streams/stream%3Aa%2Fb/writeChunk", b'[{"__type":"Uint8Array","data":"AAEC"}]')
    assert (resp.status_code, resp.content) == (200, b"0")
    assert Stream.objects.get().name == "stream:a/b"
    same = rpc.raw("//v1//rpc//streams//stream%3Aa%2Fb//getInfo", b"[]")
    assert (same.status_code, same.content) == (200, b'{"tailIndex":0,"done":false}')
    assert chunks(rpc, "stream:a/b", 0, 1)["chunks"] == [b"\x00\x01\x02"]
    # "stream:a" is a different cell
    assert rpc.ok("streams", "stream:a", "getInfo") == {"tailIndex": -1, "done": False}


def test_it_keeps_streams_apart(rpc):
    write(rpc, "stream:one", b"1")
    write(rpc, "stream:two", b"2")
    write(rpc, "stream:two", b"22")
    rpc.ok("streams", "stream:one", "closeStream")
    assert chunks(rpc, "stream:one") == {"chunks": [b"1"], "done": True, "tailIndex": 0}
    assert chunks(rpc, "stream:two") == {"chunks": [b"2", b"22"], "done": False, "tailIndex": 1}


@pytest.mark.parametrize(
    "args,field",
    [
        ([], "params"),
        ([None], "params"),
        ([3], "params"),
        ([{}], "params.startIndex"),
        ([{"startIndex": "1"}], "params.startIndex"),
        ([{"startIndex": 1.5}], "params.startIndex"),
        ([{"startIndex": 0, "limit": -1}], "params.limit"),
        ([{"startIndex": 0, "limit": 2.5}], "params.limit"),
        ([{"startIndex": 0, "limit": False}], "params.limit"),
    ],
)
def test_it_rejects_bad_get_chunks_params_with_400(rpc, args, field):
    write(rpc, "stream:v", b"x")
    status, body = rpc("streams", "stream:v", "getChunks", *args)
    assert status == 400
    assert body["error"]["name"] == "ValidationError"
    assert body["error"]["message"].startswith(field + ":")


def test_it_rejects_a_write_without_data_with_400(rpc):
    status, body = rpc("streams", "stream:v", "writeChunk")
    assert (status, body["error"]["name"]) == (400, "ValidationError")
    assert not Stream.objects.exists()


def test_it_stores_json_null_as_a_real_chunk(rpc):
    assert write(rpc, "stream:null", None) == 0
    assert chunks(rpc, "stream:null")["chunks"] == [None]


def test_it_serves_both_roles_on_one_cell(rpc):
    write(rpc, "run-streams:wrun_1", b"x")
    rpc.ok("streams", "run-streams:wrun_1", "registerStream", "s")
    assert rpc.ok("streams", "run-streams:wrun_1", "listStreams") == ["s"]
    assert rpc.ok("streams", "run-streams:wrun_1", "getInfo") == {"tailIndex": 0, "done": False}
