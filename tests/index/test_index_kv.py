"""Plain key/value methods of the index cell (docs/protocol.md §4.3, §6.2; acceptance §11.5 item 28)."""
from datetime import datetime, timezone

import pytest

from cells.index import IndexCell
from cells.models import IndexEntry
from worldcell import codec

pytestmark = pytest.mark.django_db


def test_it_gets_null_then_the_stored_string_then_null_after_delete(rpc):
    assert rpc.ok("index", "index", "get", "run:wf:1") is None
    assert rpc.ok("index", "index", "put", "run:wf:1", '{"runId":"wrun_1"}') is None
    assert rpc.ok("index", "index", "get", "run:wf:1") == '{"runId":"wrun_1"}'
    assert rpc.ok("index", "index", "delete", "run:wf:1") is None
    assert rpc.ok("index", "index", "get", "run:wf:1") is None


def test_it_answers_put_with_the_body_null(rpc):
    resp = rpc.call_raw("index", "index", "put", "k", "v")
    assert resp.status_code == 200
    assert resp.content == b"null"


def test_it_deletes_a_key_that_never_existed_without_error(rpc):
    assert rpc.ok("index", "index", "delete", "never-existed") is None


def test_it_overwrites_on_put(rpc):
    rpc.ok("index", "index", "put", "k", "one")
    rpc.ok("index", "index", "put", "k", "two")
    assert rpc.ok("index", "index", "get", "k") == "two"
    assert IndexEntry.objects.filter(cell="index", key="k").count() == 1


@pytest.mark.parametrize(
    "value",
    [
        "plain string",
        "with \u0000 nul and \U0001f600 and \ud800 lone surrogate",
        "",
        0,
        -1.5,
        True,
        [1, "two", None],
        {"owner": {"runId": "wrun_A", "hookId": "h1"}, "reservedAt": 1767323045678},
        b"\x00\x01\xfe\xff",
        b"",
        datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc),
        {"nested": {"createdAt": datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=timezone.utc)}},
        {"__uint8array": True, "data": [1, 2]},
    ],
    ids=repr,
)
def test_it_round_trips_any_json_value_bytes_and_dates(rpc, value):
    rpc.ok("index", "index", "put", "k", value)
    assert rpc.ok("index", "index", "get", "k") == value


def test_it_stores_json_null_as_a_present_key(rpc):
    rpc.ok("index", "index", "put", "k", None)
    assert rpc.ok("index", "index", "get", "k") is None
    assert rpc.ok("index", "index", "list", None)["keys"] == [{"name": "k"}]


def test_it_stores_values_as_codec_text(rpc):
    rpc.ok("index", "index", "put", "k", b"hi")
    assert IndexEntry.objects.get(cell="index", key="k").value == codec.encode(b"hi")


def test_it_keeps_cells_with_different_names_apart(rpc):
    rpc.ok("index", "index", "put", "k", "global")
    rpc.ok("index", "other/index", "put", "k", "other")
    assert rpc.ok("index", "index", "get", "k") == "global"
    assert rpc.ok("index", "other/index", "get", "k") == "other"
    rpc.ok("index", "other/index", "delete", "k")
    assert rpc.ok("index", "index", "get", "k") == "global"


@pytest.mark.parametrize("key", ["", "ключ", "\U0001f600", "a%b_c\\d", "x" * 2048])
def test_it_accepts_any_storable_key(rpc, key):
    rpc.ok("index", "index", "put", key, "v")
    assert rpc.ok("index", "index", "get", key) == "v"


@pytest.mark.parametrize(
    "method,args,field",
    [
        ("get", [], "key"),
        ("get", [None], "key"),
        ("get", [5], "key"),
        ("put", [["k"], "v"], "key"),
        ("put", ["k"], "value"),
        ("delete", [{"k": 1}], "key"),
        ("put", ["nul\u0000key", "v"], "key"),
        ("put", ["lone\ud800", "v"], "key"),
        ("put", ["x" * 2049, "v"], "key"),
    ],
)
def test_it_rejects_a_bad_key_or_missing_value_with_400(rpc, method, args, field):
    status, body = rpc("index", "index", method, *args)
    assert status == 400
    assert body["error"]["name"] == "ValidationError"
    assert body["error"]["message"].startswith(field + ":")
    assert IndexEntry.objects.count() == 0


def test_it_rejects_a_cell_name_with_a_nul_character(rpc):
    status, body = rpc("index", "in\u0000dex", "get", "k")
    assert status == 400
    assert body["error"]["name"] == "ValidationError"


def test_it_serves_the_same_data_to_direct_service_calls():
    IndexCell("index").put("run:wf:1", "x")
    assert IndexCell("index").get("run:wf:1") == "x"
    assert IndexCell("elsewhere").get("run:wf:1") is None
