"""``manage.py rearm_alarms``: recompute every queue cell's alarm, make expired claims due,
wake the cells (docs/protocol.md §7.8, §9.1 item 6; docs/architecture.md "manage.py rearm_alarms")."""
from __future__ import annotations

import io
import time

import pytest
from django.core.management import CommandError, call_command

from queueing.models import Message, QueueCell
from queueing.pump import LocalPump
from queueing.service import QueueCell as QueueService
from .support import HttpSink, enqueue_request, tick

Q = "q:0"


def rearm(*args) -> str:
    out = io.StringIO()
    call_command("rearm_alarms", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_it_restores_a_wiped_alarm_and_prints_one_line_per_cell(vclock):
    QueueService("q:0").enqueue(enqueue_request(messageId="a", delaySeconds=60))
    QueueService("q:1").enqueue(enqueue_request(messageId="b"))
    QueueCell.objects.update(alarm_at=None)
    out = rearm()
    lines = out.splitlines()
    assert lines[0].startswith(
        f"q:0: pending=1 inflight=0 deadLetters=0 nextAlarm={vclock.now + 60_000} (")
    assert "in 60.0s); changed: alarm None -> " in lines[0]
    assert lines[1].startswith(f"q:1: pending=1 inflight=0 deadLetters=0 nextAlarm={vclock.now + 1} (")
    assert lines[2] == "1 cell(s) with work due now: left to the running fleet's pump (no broker)"
    assert dict(QueueCell.objects.values_list("name", "alarm_at")) == {
        "q:0": vclock.now + 60_000, "q:1": vclock.now + 1,
    }
    # nothing left to change on a second run
    assert "changed: nothing" in rearm("--queue", "q:0")


@pytest.mark.django_db
def test_it_makes_expired_claims_due_again(vclock):
    QueueService(Q).enqueue(enqueue_request(messageId="m"))
    Message.objects.update(due_at=None, inflight_deadline=vclock.now - 5, claim_token="lost")
    QueueCell.objects.update(alarm_at=None)
    out = rearm("--queue", Q)
    assert "pending=1 inflight=0" in out and "1 expired claim(s) made due" in out
    row = Message.objects.get()
    assert (row.due_at, row.inflight_deadline, row.claim_token) == (vclock.now, None, None)


@pytest.mark.django_db
def test_it_changes_nothing_on_a_dry_run(vclock):
    QueueService(Q).enqueue(enqueue_request(messageId="m"))
    Message.objects.update(due_at=None, inflight_deadline=vclock.now - 5, claim_token="lost")
    QueueCell.objects.update(alarm_at=None)
    out = rearm("--dry-run")
    assert "would change: 1 expired claim(s) made due, alarm None -> " in out
    assert out.splitlines()[-1] == "dry run: nothing was written"
    assert QueueCell.objects.get().alarm_at is None
    assert Message.objects.get().claim_token == "lost"


@pytest.mark.django_db
def test_it_refuses_an_unknown_queue_cell():
    QueueService(Q).enqueue(enqueue_request(messageId="m"))
    with pytest.raises(CommandError, match="unknown queue cell: q:7"):
        rearm("--queue", "q:7")
    with pytest.raises(CommandError, match="unknown queue cell: nope"):
        rearm("--queue", Q, "--queue", "nope")


@pytest.mark.django_db
def test_it_says_so_when_there_are_no_queue_cells():
    assert rearm() == "no queue cells\n"


@pytest.mark.django_db
def test_it_lets_a_cleared_alarm_deliver_once_rearmed(vclock):
    sink = HttpSink()
    try:
        QueueService(Q).enqueue(enqueue_request(messageId="m", target=sink.url))
        QueueCell.objects.update(alarm_at=None)
        tick(vclock, 10_000)
        assert sink.count() == 0  # no alarm: nothing fires it
        rearm()
        tick(vclock)
        assert sink.count() == 1
    finally:
        sink.close()


@pytest.mark.django_db(transaction=True)
def test_it_wakes_the_running_pump_so_the_message_is_delivered_at_once():
    sink = HttpSink()
    pump = LocalPump(interval_s=30).start()  # no ticks: only the wake-up can deliver
    try:
        QueueService(Q).enqueue(enqueue_request(messageId="m", target=sink.url, delaySeconds=3600))
        Message.objects.update(due_at=None, inflight_deadline=1, claim_token="lost")
        QueueCell.objects.update(alarm_at=None)
        out = rearm()
        assert out.splitlines()[-1] == "1 cell(s) with work due now: woken through this process's pump"
        assert sink.wait_for(1, 5)
        deadline = time.monotonic() + 5
        while Message.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Message.objects.exists()
    finally:
        pump.stop(5)
        sink.close()
