"""Payloads keep full fidelity through the run cell (docs/protocol.md §3, §5.2, docs/architecture.md rule 5)."""
import os

import pytest

from cells.models import Run

from .support import at

pytestmark = pytest.mark.django_db

TRICKY = {
    "date": at("1999-12-31T23:59:59.999"),
    "epoch": at("1970-01-01T00:00:00"),
    "bytes": bytes(range(256)),
    "empty": b"",
    "nul": "a\u0000b",
    "surrogate": "\ud800 lone",
    "astral": "\U0001f600 \ue000",
    "nested": [{"createdAt": at("2026-01-02T03:04:05.678"), "x": [None, True, 1.5, -0.0, 2**53]}],
    "legacy": {"__uint8array": True, "data": [1, 2, 3]},
    "note": "2020-01-01T00:00:00Z",
    "startedAt": "garbage",
}


def test_it_round_trips_every_kind_of_value_through_run_step_hook_and_event(run):
    created = run.create(input=[TRICKY], executionContext={"ctx": TRICKY})
    assert created["run"]["input"] == [TRICKY]
    got = run.get_run()
    assert got["input"] == [TRICKY] and got["executionContext"] == {"ctx": TRICKY}
    run.ok("step_created", "s1", {"stepName": "n", "input": TRICKY})
    run.ok("step_completed", "s1", {"result": TRICKY})
    assert run.get_step("s1")["input"] == TRICKY and run.get_step("s1")["output"] == TRICKY
    run.ok("hook_created", "h1", {"token": "t", "metadata": TRICKY})
    assert run.list_hooks()["data"][0]["metadata"] == TRICKY
    received = run.ok("hook_received", "h1", {"payload": TRICKY})["event"]
    assert run.get_event(received["eventId"]) == received
    assert received["eventData"]["payload"] == TRICKY
    run.ok("run_completed", event_data={"output": TRICKY})
    assert run.get_run()["output"] == TRICKY


def test_untagged_date_strings_are_revived_only_under_date_fields(run):
    run.create(input=[{"createdAt": "2020-01-01T00:00:00Z", "note": "2020-01-01T00:00:00Z", "startedAt": "garbage"}])
    assert run.get_run()["input"] == [
        {"createdAt": at("2020-01-01T00:00:00"), "note": "2020-01-01T00:00:00Z", "startedAt": "garbage"}]


def test_payloads_are_stored_as_ascii_codec_text(run):
    run.create(input=["\u0000", b"\x00"])
    stored = Run.objects.get().input
    assert stored == '["\\u0000",{"__type":"Uint8Array","data":"AA=="}]'


def test_it_round_trips_deep_nesting(run):
    value: object = "leaf"
    for i in range(300):
        value = {"k": [value, i]} if i % 2 else [value]
    run.create(input=[value])
    assert run.get_run()["input"] == [value]


def test_it_round_trips_a_5_mb_value(run):
    blob = os.urandom(5 * 1024 * 1024)
    text = "x\u0000" * (5 * 1024 * 1024 // 2)
    run.create(input=[blob])
    assert run.get_run()["input"] == [blob]
    run.step("s1")
    run.ok("step_completed", "s1", {"result": text})
    assert run.get_step("s1")["output"] == text
    assert run.list_events()["data"][-1]["eventData"]["result"] == text


def test_later_events_do_not_rewrite_a_big_input(run, monkeypatch):
    from worldcell import sql as storage

    sent: list[tuple[str, list]] = []
    execute = storage.execute

    def recording(db, statements):
        sent.extend((sql, list(params)) for sql, params, _ in statements)
        return execute(db, statements)

    run.create(input=[b"x" * 1_000_000])
    run.ok("step_created", "s1", {"stepName": "n", "input": b"y" * 1_000_000})
    monkeypatch.setattr(storage, "execute", recording)
    run.ok("run_started")
    run.ok("step_started", "s1")
    run.ok("step_completed", "s1", {"result": 1})
    run.ok("run_completed", event_data={"output": 2})
    updates = [sql for sql, _ in sent if sql.startswith("UPDATE")]
    assert updates and all('"input"' not in sql for sql in updates)
    assert all(len(str(p)) < 10_000 for _, params in sent for p in params)  # no payload goes back
    monkeypatch.undo()
    assert run.get_run()["input"] == [b"x" * 1_000_000]
    assert run.get_step("s1")["input"] == b"y" * 1_000_000
