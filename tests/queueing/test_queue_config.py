"""QUEUE_* settings are parsed at use time with JavaScript parseInt semantics (docs/protocol.md §7.2)."""
from __future__ import annotations

import pytest

from queueing import config, machine
from queueing.models import DeadLetter, Message
from queueing.service import QueueCell
from .support import Answer, HttpSink, enqueue_request, tick


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("42", 42), (" 42", 42), ("\t\n42", 42), ("\u00a0\ufeff7", 7), ("12abc", 12), ("+5", 5), ("-7", -7),
        ("1e3", 1), ("0x10", 0), ("3.9", 3), ("007", 7), ("abc", None), ("", None), (None, None), ("-", None),
        (" ", None), (5, 5), ("99999999999999999999", 99999999999999999999),
    ],
)
def test_it_parses_like_javascript_parse_int(raw, expected):
    assert config.js_parse_int(raw) == expected


@pytest.mark.parametrize(
    "raw,expected", [("3", 3), ("12abc", 12), ("0", 5), ("-2", 5), ("", 5), ("many", 5), (" 8 ", 8)]
)
def test_it_uses_a_positive_value_or_the_default(settings, raw, expected):
    settings.QUEUE_MAX_ATTEMPTS = raw
    settings.QUEUE_MAX_INFLIGHT = raw
    assert config.max_attempts() == expected
    assert config.max_inflight() == expected


def test_it_defaults_the_delivery_timeout_and_reads_the_callback_secret(settings):
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "garbage"
    assert config.delivery_timeout_ms() == 300_000
    settings.QUEUE_DELIVERY_TIMEOUT_MS = "1500ms"
    assert config.delivery_timeout_ms() == 1_500
    settings.WORKFLOW_CALLBACK_SECRET = ""
    assert config.callback_secret() is None
    settings.WORKFLOW_CALLBACK_SECRET = "cbs"
    assert config.callback_secret() == "cbs"


@pytest.mark.django_db
def test_it_reads_the_settings_at_use_time(settings, vclock):
    sink = HttpSink()
    sink.answer(Answer(500))
    try:
        settings.QUEUE_MAX_ATTEMPTS = "2 attempts"
        QueueCell("q:0").enqueue(enqueue_request(messageId="m", target=sink.url))
        tick(vclock)
        tick(vclock, 2_000)
        assert DeadLetter.objects.get().attempt == 2
        settings.QUEUE_MAX_INFLIGHT = "2"
        settings.QUEUE_CLAIM_LEASE_MS = "330000"  # longer than the cap: the deadline is timeout + 30 s (§7.4)
        settings.QUEUE_DELIVERY_TIMEOUT_MS = "1000"
        for i in range(3):
            QueueCell("q:0").enqueue(enqueue_request(messageId=f"n{i}", target=sink.url))
        vclock.advance(1)
        claims = machine.fire_due_alarms()
        assert len(claims) == 2
        assert set(Message.objects.exclude(inflight_deadline=None).values_list("inflight_deadline", flat=True)) == {
            vclock.now + 1_000 + 30_000
        }
    finally:
        sink.close()
