"""Payload previews (``worldcell.display``): decoded, bounded, honest about what they leave out."""
from __future__ import annotations

import html
import re
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldcell import codec, display

pytestmark = pytest.mark.django_db


def text_of(rendered: str) -> str:
    """The visible text of rendered HTML."""
    return html.unescape(re.sub(r"<[^>]+>", "", str(rendered)))


SAMPLE = {
    "nul": "a\x00b",
    "lone": "\ud800",
    "emoji": "\U0001f600",
    "bytes": b"hello bytes",
    "binary": bytes(range(40)),
    "when": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc),
    "createdAt": "2026-01-01T00:00:00.000Z",
    "numbers": [0, -1, 2.5, 1e21],
    "flags": [True, False, None],
    "nested": {"a": {"b": [[], {}]}},
}


def test_it_pretty_prints_json_with_dates_bytes_and_visible_control_characters():
    shown = text_of(display.render_payload(codec.encode(SAMPLE)))
    assert '"nul": "a\\u0000b"' in shown
    assert '"lone": "\\ud800"' in shown
    assert '"emoji": "\U0001f600"' in shown
    assert '"bytes": Uint8Array(11 bytes) utf-8 "hello bytes"' in shown
    assert '"binary": Uint8Array(40 bytes) hex 00 01 02 03' in shown
    assert '"when": Date 2026-01-02T03:04:05.678Z' in shown
    assert '"createdAt": Date 2026-01-01T00:00:00.000Z' in shown  # DATE_FIELDS revival, as the codec does
    assert "[\n    0,\n    -1,\n    2.5,\n    1e+21\n  ]" in shown
    assert f"{len(codec.encode(SAMPLE))} B stored" in shown


def test_it_renders_absent_and_null_differently():
    assert text_of(display.render_payload(None)) == "absent"
    assert text_of(display.render_payload("null")).startswith("null")


def test_it_keeps_one_line_previews_short_and_says_so_when_cut():
    value = {"items": list(range(1000)), "text": "x" * 10_000}
    shown = text_of(display.render_payload(codec.encode(value), inline=True))
    assert "\n" not in shown
    assert len(shown) < 260
    assert "… 992 more items" in shown


def test_it_caps_long_strings_and_big_arrays_in_block_previews():
    shown = text_of(display.render_payload(codec.encode({"s": "y" * 50_000, "a": list(range(5000))})))
    assert '"' + "y" * 2000 + '… (+48,000 chars)' in shown
    assert "… 4,800 more items" in shown
    assert "preview truncated" in shown


def test_it_previews_a_5_mb_bytes_payload_from_its_head_with_the_exact_size():
    big = bytes(range(256)) * 20_480  # 5 MiB of binary
    text = codec.encode(big)
    stored = display.StoredText(text[: display.BLOCK_HEAD_CHARS], len(text), text[-display.TAIL_CHARS:])
    shown = text_of(display.render_payload(stored))
    assert shown.startswith("Uint8Array(5,242,880 bytes) hex 00 01 02")
    assert f"({len(text):,} bytes) — preview truncated" in shown
    assert len(shown) < 2_000


@pytest.mark.parametrize("padding", [0, 1, 2])
def test_it_computes_the_byte_size_of_a_cut_bytes_tag_for_every_base64_padding(padding):
    data = b"z" * (300_000 + padding)
    text = codec.encode(data)
    stored = display.StoredText(text[:1000], len(text), text[-display.TAIL_CHARS:])
    assert f"Uint8Array({len(data):,} bytes)" in text_of(display.render_payload(stored))


def test_it_previews_a_cut_object_member_by_member():
    text = codec.encode({"first": 1, "when": datetime(2026, 1, 1, tzinfo=timezone.utc), "big": "q" * 100_000})
    stored = display.StoredText(text[:120], len(text), text[-8:])
    shown = text_of(display.render_payload(stored))
    assert '"first": 1' in shown and "Date 2026-01-01T00:00:00.000Z" in shown
    assert '"big": "qqq' in shown and "(cut)" in shown


def test_it_shows_text_that_is_not_json_raw():
    shown = text_of(display.render_payload("not json {"))
    assert shown.startswith("not json {")


def test_it_previews_queue_bodies_as_the_json_they_carry():
    body = codec.encode('{"runId":"wrun_1","runInput":{"input":{"__type":"Uint8Array","data":"aGk="}}}')
    shown = text_of(display.render_queue_body(body))
    assert '"runId": "wrun_1"' in shown and 'Uint8Array(2 bytes) utf-8 "hi"' in shown
    assert display.queue_body_run_id(body) == "wrun_1"
    assert display.queue_body_run_id(codec.encode('{"workflowRunId":"wrun_2"}')) == "wrun_2"
    assert display.queue_body_run_id(codec.encode("plain text body")) is None
    assert text_of(display.render_queue_body(codec.encode("plain text body"))).startswith('"plain text body"')


def test_it_previews_stream_chunks_as_text_or_hex():
    assert text_of(display.render_bytes(b"line 1\n")) == 'Uint8Array(7 bytes) utf-8 "line 1\\n"'
    assert text_of(display.render_bytes(b"\xff\x00\x01", 3)) == "Uint8Array(3 bytes) hex ff 00 01"
    assert text_of(display.render_bytes(b"abc", 1000)).endswith("…")


@pytest.mark.parametrize(
    "n, expected", [(0, "0 B"), (1023, "1,023 B"), (1024, "1.0 KB"), (5 * 1024 * 1024, "5.0 MB")]
)
def test_it_formats_sizes_for_people(n, expected):
    assert display.format_size(n) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**15, 10**15) | st.text(max_size=20) | st.binary(max_size=20)
    | st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=400))
def test_it_parses_any_prefix_of_codec_text_without_error(value, cut):
    text = codec.encode(value)
    head = text[:cut]
    if cut >= len(text):
        return
    parsed, complete = display.parse_json_prefix(head) if head else (display.CUT, False)
    assert not complete
    display.render_payload(display.StoredText(head, len(text), text[-8:]))
    display.render_payload(display.StoredText(head, len(text), text[-8:]), inline=True)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_it_parses_complete_codec_text_like_the_codec(value):
    text = codec.encode(value)
    if text[-1].isdigit() or text in ("true", "false", "null"):
        return  # a bare scalar is only known to be complete when the size says so
    parsed, complete = display.parse_json_prefix(text)
    assert complete and parsed == codec.decode(text)


def test_it_shows_a_structured_error_as_code_message_and_stack_lines():
    stored = codec.encode({"message": "Card <declined>", "code": "E_CARD", "stack": "Error: x\n    at charge (a.ts:1:2)"})
    rendered = str(display.render_structured_error(stored))
    assert '<code class="wc-code">E_CARD</code>' in rendered
    assert '<span class="wc-errmsg">Card &lt;declined&gt;</span>' in rendered
    assert '<pre class="wc-stack">Error: x\n    at charge (a.ts:1:2)</pre>' in rendered


def test_it_falls_back_to_the_json_preview_for_errors_of_another_shape():
    shown = text_of(display.render_structured_error(codec.encode({"message": "m", "extra": [1]})))
    assert '"extra": [' in shown
    assert text_of(display.render_structured_error(None)) == "absent"
