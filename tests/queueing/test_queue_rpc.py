"""The ``queue`` binding over the RPC route: shapes, CONFIG_MISMATCH, P4 listing, fresh cells,
validation (docs/protocol.md §4.0 P4, §4.4, §4.5, §7.9; §11.6 items 48, 60, 62, 64)."""
from __future__ import annotations

import json

import pytest

from queueing import machine
from queueing.models import DeadLetter, Message, QueueCell
from .support import enqueue_request

pytestmark = pytest.mark.django_db

MISMATCH = (
    "queue cell shard-count mismatch: pinned 1, got 4 \u2014 changing queueShards requires draining the fleet"
)


def plant_dead_letter(cell_name: str, message_id: str, failed_at: int, **extra) -> DeadLetter:
    cell, _ = QueueCell.objects.get_or_create(name=cell_name)
    from worldcell import codec

    fields = dict(
        queue_name="__wkf_step_x", pathname="step", body=codec.encode('{"a":1}'), target_base_url="http://app/",
        idempotency_key=None, attempt=5, enqueued_at=1_000_000, last_error="HTTP 500", failed_at=failed_at,
    )
    fields.update(extra)
    return DeadLetter.objects.create(cell=cell, dlq_key=machine.dlq_key(failed_at, message_id), message_id=message_id, **fields)


# --------------------------------------------------------------------------- enqueue


def test_it_answers_enqueue_with_the_message_id(rpc, vclock):
    assert rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="msg_01J")) == {
        "ok": True, "messageId": "msg_01J", "deduped": False,
    }
    cell = QueueCell.objects.get(name="q:0")
    assert (cell.queue_shards, cell.pinned_at, cell.alarm_at) == (1, vclock.now, vclock.now + 1)
    row = Message.objects.get()
    assert (row.message_id, row.attempt, row.enqueued_at, row.due_at, row.body_text) == (
        "msg_01J", 0, vclock.now, vclock.now, '{"data":"payload"}'
    )


def test_it_rejects_a_different_shard_count_with_config_mismatch(rpc, vclock):
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="msg_l"))
    resp = rpc.call_raw("queue", "q:0", "enqueue", enqueue_request(messageId="msg_m", shards=4))
    assert resp.status_code == 200
    assert json.loads(resp.content) == {"ok": False, "code": "CONFIG_MISMATCH", "message": MISMATCH}
    assert "\\u2014" in resp.content.decode() or "\u2014" in resp.content.decode()
    assert list(Message.objects.values_list("message_id", flat=True)) == ["msg_l"]


def test_it_checks_the_shard_count_before_dedup(rpc, vclock):
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="a", idempotencyKey="k"))
    assert rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="b", idempotencyKey="k", shards=4)) == {
        "ok": False, "code": "CONFIG_MISMATCH", "message": MISMATCH,
    }


def test_it_pins_only_the_shard_count_not_the_target(rpc, vclock):
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="a", target="http://one"))
    assert rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="b", target="http://two"))["ok"] is True
    assert dict(Message.objects.values_list("message_id", "target_base_url")) == {"a": "http://one", "b": "http://two"}


def test_it_accepts_null_for_the_optional_members(rpc, vclock):
    out = rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="n", idempotencyKey=None, delaySeconds=None))
    assert out["ok"] is True
    assert Message.objects.get().idempotency_key is None


def test_it_overwrites_a_live_message_enqueued_again_with_the_same_id(rpc, vclock):
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="same", delaySeconds=10))
    Message.objects.update(attempt=3, last_error="HTTP 500")
    vclock.advance(5)
    assert rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="same", body="two"))["deduped"] is False
    row = Message.objects.get()
    assert (row.attempt, row.last_error, row.body_text, row.due_at) == (0, None, "two", vclock.now)


def test_it_persists_nothing_when_the_enqueue_transaction_fails(rpc, vclock, monkeypatch):
    from queueing import machine as m

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(m.enqueueing, "arm_alarm_at_most", boom)
    status, body = rpc("queue", "q:0", "enqueue", enqueue_request(messageId="x"))
    assert status == 500 and body["error"] == {"name": "RuntimeError", "message": "injected"}
    assert not Message.objects.exists()
    assert not QueueCell.objects.filter(queue_shards__isnull=False).exists()


@pytest.mark.parametrize(
    "request_,message",
    [
        (None, "request: expected an object"),
        ([], "request: expected an object"),
        ({"messageId": "m"}, "request.config: expected an object"),
        (enqueue_request(messageId=5), "request.messageId: expected a string, got int"),
        (enqueue_request(messageId="m", body={"a": 1}), "request.body: expected a string, got dict"),
        (enqueue_request(messageId="m", queueName=None), "request.queueName: expected a string"),
        (enqueue_request(messageId="m", pathname=1), "request.pathname: expected a string, got int"),
        (enqueue_request(messageId="m", target=None), "request.config.targetBaseUrl: expected a string"),
        (enqueue_request(messageId="m", shards="1"), "request.config.queueShards: expected an integer"),
        (enqueue_request(messageId="m", shards=1.5), "request.config.queueShards: expected an integer"),
        (enqueue_request(messageId="m", idempotencyKey=7), "request.idempotencyKey: expected a string, got int"),
        (enqueue_request(messageId="m", delaySeconds="5"), "request.delaySeconds: expected a number"),
        (enqueue_request(messageId="m", delaySeconds=True), "request.delaySeconds: expected a number"),
        (enqueue_request(messageId="a\x00b"), "request.messageId: must not contain U+0000"),
    ],
)
def test_it_answers_400_for_a_malformed_enqueue_and_writes_nothing(rpc, request_, message):
    status, body = rpc("queue", "q:0", "enqueue", request_)
    assert status == 400
    assert body == {"error": {"name": "ValidationError", "message": message}}
    assert not QueueCell.objects.exists()


def _random_text(n: int) -> str:
    import secrets

    return secrets.token_urlsafe(n)[:n]  # incompressible: PostgreSQL cannot shrink it into an index entry


@pytest.mark.parametrize(
    "over,message",
    [
        ({"messageId": "m" * 1025}, "request.messageId: longer than 1024 UTF-8 bytes"),
        ({"messageId": "\u00e9" * 513}, "request.messageId: longer than 1024 UTF-8 bytes"),
        ({"idempotencyKey": "k" * 2049}, "request.idempotencyKey: longer than 2048 UTF-8 bytes"),
        ({"queueName": "q" * 1025}, "request.queueName: longer than 1024 UTF-8 bytes"),
        ({"pathname": "p" * 1025}, "request.pathname: longer than 1024 UTF-8 bytes"),
        ({"target": "http://a/" + "x" * 8184}, "request.config.targetBaseUrl: longer than 8192 UTF-8 bytes"),
    ],
)
def test_it_answers_400_for_over_long_ids_keys_and_names_before_touching_the_database(rpc, over, message):
    status, body = rpc("queue", "q:0", "enqueue", enqueue_request(**{"messageId": "m", **over}))
    assert (status, body) == (400, {"error": {"name": "ValidationError", "message": message}})
    assert not QueueCell.objects.exists()


def test_it_answers_400_for_random_3000_character_ids_instead_of_leaking_index_errors(rpc):
    for over in ({"messageId": _random_text(3000)}, {"messageId": "m", "idempotencyKey": _random_text(3000)}):
        status, body = rpc("queue", "q:0", "enqueue", enqueue_request(**over))
        assert status == 400 and body["error"]["name"] == "ValidationError", body
    name = "q:" + _random_text(3000)
    for method, args in (("enqueue", [enqueue_request(messageId="m")]), ("stats", [])):
        status, body = rpc("queue", name, method, *args)
        assert status == 400, body
        assert body["error"] == {"name": "ValidationError", "message": "cell name: longer than 1024 UTF-8 bytes"}
    assert not QueueCell.objects.exists()
    assert rpc.ok("queue", "q:0", "redriveDeadLetter", _random_text(3000)) == {"ok": False}


def test_it_stores_and_dead_letters_ids_and_keys_right_at_the_caps(rpc, vclock):
    mid, key, name = _random_text(1024), _random_text(2048), "q:" + _random_text(1022)
    req = enqueue_request(messageId=mid, idempotencyKey=key, queueName=_random_text(1024),
                          pathname=_random_text(1024), target="http://127.0.0.1:1/" + _random_text(8172))
    assert rpc.ok("queue", name, "enqueue", req) == {"ok": True, "messageId": mid, "deduped": False}
    assert rpc.ok("queue", name, "enqueue", {**req, "messageId": "other"})["deduped"] is True
    plant_dead_letter(name, mid, 1_030_001, idempotency_key=key)
    [dead] = rpc.ok("queue", name, "listDeadLetters")["data"]
    assert dead["messageId"] == mid


def test_it_answers_400_for_enqueue_without_arguments(rpc):
    status, body = rpc("queue", "q:0", "enqueue")
    assert status == 400 and body["error"]["message"] == "request: expected an object"


def test_it_accepts_any_cell_name_and_integral_floats(rpc, vclock):
    req = enqueue_request(messageId="m")
    req["config"]["queueShards"] = 2.0
    assert rpc.ok("queue", "q:weird/\u00e9", "enqueue", req)["ok"] is True
    assert QueueCell.objects.get().name == "q:weird/\u00e9"
    assert QueueCell.objects.get().queue_shards == 2


# --------------------------------------------------------------------------- fresh cells (62)


def test_it_answers_empty_for_a_fresh_cell_without_creating_it(rpc):
    assert rpc.ok("queue", "q:9", "stats") == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}
    assert rpc.ok("queue", "q:9", "rearmAlarm") == {"alarmAt": None}
    assert rpc.ok("queue", "q:9", "listDeadLetters") == {"data": [], "cursor": None, "hasMore": False}
    assert rpc.ok("queue", "q:9", "listDeadLetters", None) == {"data": [], "cursor": None, "hasMore": False}
    assert rpc.ok("queue", "q:9", "redriveDeadLetter", "nope") == {"ok": False}
    assert rpc.ok("queue", "q:9", "purgeDeadLetters") == {"purged": 0}
    assert not QueueCell.objects.exists()


def test_it_ignores_extra_arguments(rpc):
    assert rpc.ok("queue", "q:9", "stats", 1, 2, 3) == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


# --------------------------------------------------------------------------- P4 listing (60)


def test_it_pages_dead_letters_by_failed_at_then_message_id_with_full_key_cursors(rpc):
    plant_dead_letter("q:0", "m2", 1_030_001)
    plant_dead_letter("q:0", "m1", 1_030_001)
    plant_dead_letter("q:0", "m0", 2_000_000)
    plant_dead_letter("q:1", "other", 1)
    page = rpc.ok("queue", "q:0", "listDeadLetters", {"limit": 2})
    assert [r["messageId"] for r in page["data"]] == ["m1", "m2"]
    assert page["cursor"] == "dlq:0000001030001:m2" and page["hasMore"] is True
    assert page["data"][0] == {
        "messageId": "m1", "queueName": "__wkf_step_x", "pathname": "step", "body": '{"a":1}',
        "targetBaseUrl": "http://app/", "attempt": 5, "enqueuedAt": 1_000_000, "lastError": "HTTP 500",
        "failedAt": 1_030_001,
    }
    page2 = rpc.ok("queue", "q:0", "listDeadLetters", {"limit": 2, "cursor": page["cursor"]})
    assert [r["messageId"] for r in page2["data"]] == ["m0"]
    assert (page2["cursor"], page2["hasMore"]) == (None, False)
    # a page that ends exactly at the last row: no more
    page3 = rpc.ok("queue", "q:0", "listDeadLetters", {"limit": 3})
    assert (len(page3["data"]), page3["cursor"], page3["hasMore"]) == (3, None, False)
    assert rpc.ok("queue", "q:0", "listDeadLetters", {"cursor": "dlq:0000001030001:m1"})["data"][0]["messageId"] == "m2"
    assert rpc.ok("queue", "q:0", "listDeadLetters", {"cursor": ""})["data"][0]["messageId"] == "m1"
    assert rpc.ok("queue", "q:0", "listDeadLetters", {"cursor": "dlq:9"})["data"] == []
    assert len(rpc.ok("queue", "q:0", "listDeadLetters", {"cursor": None, "limit": None})["data"]) == 3


def test_it_answers_limit_zero_with_has_more_and_no_cursor_member(rpc):
    assert rpc.call_raw("queue", "q:0", "listDeadLetters", {"limit": 0}).content == (
        b'{"data":[],"cursor":null,"hasMore":false}'
    )
    plant_dead_letter("q:0", "m1", 1_030_001)
    assert rpc.call_raw("queue", "q:0", "listDeadLetters", {"limit": 0}).content == b'{"data":[],"hasMore":true}'


def test_it_keeps_an_empty_idempotency_key_on_a_dead_letter_row(rpc):
    plant_dead_letter("q:0", "m1", 5, idempotency_key="")
    assert rpc.ok("queue", "q:0", "listDeadLetters")["data"][0]["idempotencyKey"] == ""


@pytest.mark.parametrize(
    "params,message",
    [
        ([], "params: expected an object"),
        ({"limit": -1}, "params.limit: must be >= 0"),
        ({"limit": 1.5}, "params.limit: expected an integer"),
        ({"limit": "5"}, "params.limit: expected an integer"),
        ({"cursor": 5}, "params.cursor: expected a string"),
    ],
)
def test_it_answers_400_for_malformed_listing_params(rpc, params, message):
    status, body = rpc("queue", "q:0", "listDeadLetters", params)
    assert (status, body) == (400, {"error": {"name": "ValidationError", "message": message}})


def test_it_refuses_to_redrive_an_unknown_or_malformed_id(rpc):
    plant_dead_letter("q:0", "m1", 1)
    for arg in ("nope", None, 5, "m1\x00"):
        assert rpc.ok("queue", "q:0", "redriveDeadLetter", arg) == {"ok": False}
    assert rpc.ok("queue", "q:0", "redriveDeadLetter") == {"ok": False}


def test_it_redrives_the_first_dead_letter_of_a_message_in_key_order(rpc, vclock):
    plant_dead_letter("q:0", "m1", 2_000, last_error="second")
    plant_dead_letter("q:0", "m1", 1_000, last_error="first", enqueued_at=7)
    assert rpc.ok("queue", "q:0", "redriveDeadLetter", "m1") == {"ok": True}
    assert list(DeadLetter.objects.values_list("last_error", flat=True)) == ["second"]
    row = Message.objects.get()
    assert (row.enqueued_at, row.attempt, row.last_error, row.due_at) == (7, 0, None, vclock.now)
    assert QueueCell.objects.get(name="q:0").alarm_at == vclock.now + 1


def test_it_purges_only_the_cells_own_dead_letters(rpc):
    for i in range(3):
        plant_dead_letter("q:0", f"m{i}", i)
    plant_dead_letter("q:1", "keep", 1)
    assert rpc.ok("queue", "q:0", "purgeDeadLetters") == {"purged": 3}
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == ["keep"]


def test_it_orders_dead_letters_by_utf8_bytes_of_their_keys(rpc):
    for mid in ("\U0001f600", "a", "\u00e9", "Z", "\uff5e", "a b"):
        plant_dead_letter("q:0", mid, 1_000)
    page = rpc.ok("queue", "q:0", "listDeadLetters")
    assert [r["messageId"] for r in page["data"]] == ["Z", "a", "a b", "\u00e9", "\uff5e", "\U0001f600"]
    after = rpc.ok("queue", "q:0", "listDeadLetters", {"cursor": "dlq:0000000001000:a\uffff"})
    assert [r["messageId"] for r in after["data"]] == ["\u00e9", "\uff5e", "\U0001f600"]


@pytest.mark.postgres_only
def test_it_gives_the_ordered_key_columns_the_c_collation_on_postgresql():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_name IN ('queueing_message', 'queueing_deadletter') AND collation_name IS NOT NULL"
        )
        got = {(t, c): coll for t, c, coll in cur.fetchall()}
    assert got[("queueing_deadletter", "dlq_key")] == "C"
    assert got[("queueing_message", "message_id")] == "C"
