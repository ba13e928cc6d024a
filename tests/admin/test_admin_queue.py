"""The queue pages of the operator console: dashboard, messages, dead letters, redrive and purge (docs/protocol.md §7.9).

Messages are enqueued with the queue service and delivered to a real HTTP
sink on a virtual clock (``tests/queueing/support.py``), as in ``test_queue_delivery``.
"""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import DELETION, LogEntry

from queueing.models import DeadLetter, Message, QueueCell
from queueing.service import QueueCell as QueueService
from tests.queueing.support import Answer, HttpSink, VirtualClock, enqueue_request, tick

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

DEAD = "/admin/queueing/deadletter/"
MESSAGES = "/admin/queueing/message/"
CELLS = "/admin/queueing/queuecell/"


class Queue:
    """Enqueue through the queue service and fail or deliver with the sink."""

    def __init__(self, sink: HttpSink, vclock: VirtualClock):
        self.sink, self.vclock = sink, vclock

    def enqueue(self, cell: str = "q:0", **over):
        over.setdefault("target", self.sink.url)
        return QueueService(cell).enqueue(enqueue_request(**over))

    def dead_letter(self, message_id: str, cell: str = "q:0", key: str | None = None, body: str | None = None):
        """Enqueue ``message_id`` and fail its five attempts (HTTP 500) until it is a dead letter."""
        self.sink.answer(Answer(500, {"error": "down"}))
        extra = {"idempotencyKey": key} if key else {}
        if body is not None:
            extra["body"] = body
        self.enqueue(cell, messageId=message_id, **extra)
        for ms in (0, 2_100, 4_100, 8_100, 16_100):
            tick(self.vclock, ms)
        assert DeadLetter.objects.filter(message_id=message_id).exists()


@pytest.fixture
def queue(sink, vclock):
    return Queue(sink, vclock)


def selected(*message_ids: str) -> list[str]:
    return [str(pk) for pk in DeadLetter.objects.filter(message_id__in=message_ids).values_list("pk", flat=True)]


# --------------------------------------------------------------------------- dashboard


def test_it_shows_a_dashboard_row_per_queue_cell(admin_client, queue, vclock):
    queue.dead_letter("msg_dead", cell="q:1")
    queue.enqueue("q:0", messageId="msg_later", delaySeconds=30)
    queue.enqueue("q:0", messageId="msg_now")
    vclock.advance(4_000)  # msg_now has been due for 4 s: no alarm fired it
    response = admin_client.get(CELLS)
    assert response.status_code == 200
    html = response.content.decode()
    rows = re.findall(r'<tr>.*?</tr>', html, re.S)
    q0 = next(r for r in rows if ">q:0<" in r)
    q1 = next(r for r in rows if ">q:1<" in r)
    assert 'state=pending">2</a>' in q0 and 'state=inflight">0</a>' in q0
    assert "due 4.0 s ago" in q0  # age of the oldest due message
    assert f'cell__id__exact={QueueCell.objects.get(name="q:1").pk}">1</a>' in q1  # its dead letters
    assert "none" in q1  # q:1 has no alarm any more
    assert "dead letters" in html and "late alarms" in html


def test_it_shows_a_queue_cells_page_with_stats_due_messages_and_dead_letters(admin_client, queue, sink, vclock):
    queue.dead_letter("msg_dead")
    sink.answer(Answer(200))
    queue.enqueue(messageId="msg_soon", delaySeconds=5, body='{"runId":"wrun_Q","n":1}')
    cell = QueueCell.objects.get(name="q:0")
    html = admin_client.get(f"{CELLS}{cell.pk}/change/").content.decode()
    assert "Queue cell q:0" in html
    assert re.search(r'pending</div><div class="wc-stat-value"><a href="[^"]+">1</a>', html)
    assert re.search(r'dead letters</div><div class="wc-stat-value"><a href="[^"]+">1</a>', html)
    assert "msg_soon" in html and "next due in 5.0 s" in html
    assert "msg_dead" in html and "HTTP 500" in html
    assert "&quot;wrun_Q&quot;" in html  # decoded body preview


# --------------------------------------------------------------------------- messages


def test_it_lists_messages_with_state_attempts_last_error_and_body(admin_client, queue, sink, vclock):
    sink.answer(Answer(500, {"error": "down"}))
    queue.enqueue(messageId="msg_flaky", body='{"workflowRunId":"wrun_M","stepId":"step_9"}')
    tick(vclock)  # first attempt fails: attempt 1, due again in 2 s
    html = admin_client.get(MESSAGES).content.decode()
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if "msg_flaky" in r)
    assert "pending" in row and "HTTP 500" in row and "<td class=\"field-attempt\">1</td>" in row
    assert "&quot;step_9&quot;" in row
    assert "1 message" in html

    message = Message.objects.get(message_id="msg_flaky")
    detail = admin_client.get(f"{MESSAGES}{message.pk}/change/").content.decode()
    assert "/admin/cells/run/by-id/wrun_M/" in detail  # the run the step message concerns
    assert "HTTP 500" in detail and "&quot;workflowRunId&quot;" in detail


@pytest.mark.parametrize("state, expected", [("pending", ["msg_a"]), ("inflight", []), ("idle", [])])
def test_it_filters_messages_by_state(admin_client, queue, state, expected):
    queue.enqueue(messageId="msg_a")
    html = admin_client.get(MESSAGES, {"state": state}).content.decode()
    assert re.findall(r">(msg_\w+)</a></th>", html) == expected


def test_it_finds_a_message_by_id_or_idempotency_key(admin_client, queue):
    queue.enqueue(messageId="msg_k", idempotencyKey="order-7")
    queue.enqueue(messageId="msg_other")
    for term in ("msg_k", "order-7"):
        html = admin_client.get(MESSAGES, {"q": term}).content.decode()
        assert re.findall(r">(msg_\w+)</a></th>", html) == ["msg_k"]


# --------------------------------------------------------------------------- dead letters


def test_it_lists_dead_letters_with_queue_pathname_attempts_error_failed_at_and_body(admin_client, queue, vclock):
    queue.dead_letter("msg_d1", body='{"runId":"wrun_D","blob":{"__type":"Uint8Array","data":"AAEC"}}')
    html = admin_client.get(DEAD).content.decode()
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if "msg_d1" in r)
    assert "q:0" in row and "__wkf_step_test" in row and ">step<" in row
    assert '<td class="field-attempt">5</td>' in row and "HTTP 500" in row
    assert "Uint8Array(3 bytes)" in row and "&quot;wrun_D&quot;" in row
    dead = DeadLetter.objects.get()
    from worldcell.codec import format_iso, from_epoch_ms

    assert format_iso(from_epoch_ms(dead.failed_at)).replace("T", " ").rstrip("Z") in row


def test_it_redrives_selected_dead_letters_which_are_then_delivered(admin_client, queue, sink, vclock):
    queue.dead_letter("msg_r", key="key-r")
    response = admin_client.post(
        DEAD, {"action": "redrive_selected", "_selected_action": selected("msg_r")}, follow=True
    )
    assert b"Redrove 1 dead letter: due again now." in response.content
    assert not DeadLetter.objects.exists()
    message = Message.objects.get(message_id="msg_r")
    assert (message.attempt, message.last_error, message.due_at) == (0, None, vclock.now)
    assert QueueService("q:0").stats() == {"pending": 1, "inflight": 0, "deadLetters": 0, "alarmAt": vclock.now + 1}

    sink.answer(Answer(200))
    before = sink.count()
    tick(vclock)
    assert sink.count() == before + 1
    last = sink.requests[-1]
    assert last.message_id == "msg_r" and last.attempt == "1"
    assert not Message.objects.exists()  # acked

    entry = LogEntry.objects.get()
    assert entry.is_change() and "Redriven" in entry.change_message


def test_it_reports_a_refused_redrive_and_why(admin_client, queue, sink, vclock):
    queue.dead_letter("msg_old", key="shared-key")
    queue.dead_letter("msg_fine")
    queue.enqueue(messageId="msg_new", idempotencyKey="shared-key", delaySeconds=60)
    response = admin_client.post(
        DEAD, {"action": "redrive_selected", "_selected_action": selected("msg_old", "msg_fine")}, follow=True
    )
    html = response.content.decode()
    assert "Redrove 1 dead letter" in html
    assert "Could not redrive 1 dead letter: msg_old (q:0): live message msg_new holds its idempotency key" in html
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == ["msg_old"]
    assert sorted(LogEntry.objects.values_list("change_message", flat=True))[0].startswith("Redrive refused")


def test_it_purges_selected_dead_letters_and_logs_each_deletion(admin_client, queue):
    queue.dead_letter("msg_p1")
    queue.dead_letter("msg_p2", cell="q:1")
    queue.dead_letter("msg_keep")
    response = admin_client.post(
        DEAD, {"action": "purge_selected", "_selected_action": selected("msg_p1", "msg_p2")}, follow=True
    )
    assert b"Purged 2 dead letters." in response.content
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == ["msg_keep"]
    entries = LogEntry.objects.filter(action_flag=DELETION)
    assert entries.count() == 2 and {e.change_message for e in entries} == {"Purged from q:0", "Purged from q:1"}


def test_it_purges_all_dead_letters_only_after_a_confirmation_page(admin_client, queue):
    queue.dead_letter("msg_a1")
    queue.dead_letter("msg_a2", cell="q:1")
    page = admin_client.get(f"{DEAD}purge-all/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Yes, purge 2 dead letters" in html and "q:0" in html and "q:1" in html
    assert DeadLetter.objects.count() == 2  # GET changes nothing

    response = admin_client.post(f"{DEAD}purge-all/", {"post": "yes"}, follow=True)
    assert b"Purged 2 dead letters (q:0: 1, q:1: 1)." in response.content
    assert not DeadLetter.objects.exists()
    assert LogEntry.objects.filter(change_message__startswith="Purged all dead letters").count() == 2


def test_it_purges_all_dead_letters_of_one_cell(admin_client, queue):
    queue.dead_letter("msg_c0")
    queue.dead_letter("msg_c1", cell="q:1")
    q1 = QueueCell.objects.get(name="q:1")
    page = admin_client.get(f"{DEAD}purge-all/", {"cell": q1.pk}).content.decode()
    assert "Yes, purge 1 dead letter" in page and "q:0" not in page
    admin_client.post(f"{DEAD}purge-all/", {"post": "yes", "cell": q1.pk})
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == ["msg_c0"]


def test_it_redrives_and_purges_from_the_dead_letter_page(admin_client, queue):
    queue.dead_letter("msg_btn1")
    queue.dead_letter("msg_btn2")
    one, two = (DeadLetter.objects.get(message_id=m) for m in ("msg_btn1", "msg_btn2"))
    page = admin_client.get(f"{DEAD}{one.pk}/change/").content.decode()
    assert 'value="Redrive"' in page and 'value="Purge"' in page
    assert admin_client.get(f"{DEAD}{one.pk}/redrive/").status_code == 403  # POST only
    admin_client.post(f"{DEAD}{one.pk}/redrive/")
    admin_client.post(f"{DEAD}{two.pk}/purge/")
    assert not DeadLetter.objects.exists()
    assert list(Message.objects.values_list("message_id", flat=True)) == ["msg_btn1"]


def test_it_filters_dead_letters_by_cell_pathname_queue_name_and_age(admin_client, queue, vclock):
    queue.dead_letter("msg_f1")
    queue.dead_letter("msg_f2", cell="q:1")
    q1 = QueueCell.objects.get(name="q:1")

    def listed(**params):
        html = admin_client.get(DEAD, params).content.decode()
        return sorted(re.findall(r">(msg_\w+)</a></th>", html))

    assert listed(cell__id__exact=q1.pk) == ["msg_f2"]
    assert listed(pathname__exact="step") == ["msg_f1", "msg_f2"]
    assert listed(queue_name="__wkf_step_test") == ["msg_f1", "msg_f2"]
    assert listed(failed="1h") == ["msg_f1", "msg_f2"]
    vclock.advance(2 * 3_600_000)
    assert listed(failed="1h") == []
    assert listed(q="msg_f2") == ["msg_f2"]
