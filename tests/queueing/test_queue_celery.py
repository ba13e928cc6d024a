"""The queue driven by a real Celery worker (threads pool) and beat over Redis, against the
test database (docs/architecture.md "Delivery", rules 3 and 6; docs/protocol.md §7, §9.1; §11.6 item 66).

The worker and beat run as subprocesses pointed at this test database
(``transaction=True`` tests commit, so they see the data) and at this test process's own Redis
(``tests.services.session_redis``).
Enqueues from this process wake the cell through Celery on commit.
"""
from __future__ import annotations

import json
import random
import re
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from queueing.models import DeadLetter, Message, QueueCell
from queueing.service import QueueCell as QueueService
from .support import Answer, enqueue_request, wait_until
from tests.services import CeleryProc, process_env, session_redis, test_database_url, worker_args
from .fault_support import use_broker

pytestmark = [pytest.mark.celery, pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

#: the worker dead-letters after 3 counted failures (2 s + 4 s of backoff), to keep the module short
MAX_ATTEMPTS = 3


def _env(tmp: Path) -> dict[str, str]:
    return process_env(test_database_url(), tmp, broker_url=session_redis().url, QUEUE_MAX_ATTEMPTS=str(MAX_ATTEMPTS))


def start_worker(tmp: Path, name: str = "worker", visibility_timeout: float | None = None) -> CeleryProc:
    """README.md's worker (threads pool, 16 threads), or the same with a short broker visibility timeout."""
    if visibility_timeout is None:
        return CeleryProc("worker", name, tmp, _env(tmp), concurrency=16, heartbeat=True)
    code = (
        "import sys; from worldcell.celery import app; "
        "app.conf.broker_transport_options = {"
        f"'visibility_timeout': {visibility_timeout}, 'unacked_restore_interval': 1, "
        "'unacked_restore_throttle': 1}; "
        "app.worker_main(sys.argv[1:])"
    )
    return CeleryProc("worker", name, tmp, _env(tmp), cmd=[sys.executable, "-c", code, *worker_args(name, 16, True)])


def start_beat(tmp: Path, name: str = "beat") -> CeleryProc:
    return CeleryProc("beat", name, tmp, _env(tmp))


@pytest.fixture(scope="module")
def broker():
    """This test process's own Redis (``tests.services.session_redis``), emptied, as its Celery broker."""
    import redis

    from worldcell.celery import app

    url = session_redis().url
    redis.Redis.from_url(url).flushall()
    undo = use_broker(url)  # also resets the cached write URL and producer pool
    yield app
    undo()


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, broker, tmp_path_factory):
    """One real worker for the module: ``celery -A worldcell worker --pool threads --concurrency 16``."""
    tmp = tmp_path_factory.mktemp("celery")
    with django_db_blocker.unblock():
        w = start_worker(tmp)
    yield w
    w.stop()


@pytest.fixture(autouse=True)
def use_celery(settings, worker):
    settings.WORLDCELL_USE_CELERY = True


def settled():
    """No live message left (and give the last outcome transactions a moment)."""
    wait_until(lambda: not Message.objects.exists(), 20, "every message to be acked")
    time.sleep(0.2)


def enqueue(cell: str, **over):
    return QueueService(cell).enqueue(enqueue_request(**over))


def test_it_delivers_through_the_worker_right_after_commit_without_beat(rpc, sink, worker):
    t0 = time.time()
    assert rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="msg_fast", target=sink.url))["ok"]
    assert sink.wait_for(1, 10), worker.text()[-3000:]
    assert sink.requests[0].at - t0 < 1.0  # no beat runs here: the on-commit wake did it
    req = sink.requests[0]
    assert (req.message_id, req.attempt, req.body) == ("msg_fast", "1", b'{"data":"payload"}')
    settled()
    assert rpc.ok("queue", "q:0", "stats") == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_retries_with_backoff_and_dead_letters_then_redrives_through_the_worker(rpc, sink, worker):
    sink.answer(Answer(500))
    enqueue("q:0", messageId="msg_dead", idempotencyKey="k", target=sink.url)
    # the worker's pump times the 2 s and 4 s backoffs itself (no beat runs here)
    wait_until(lambda: DeadLetter.objects.exists(), 20, "the dead letter")
    assert [r.attempt for r in sink.requests] == ["1", "2", "3"]
    gaps = [b.at - a.at for a, b in zip(sink.requests, sink.requests[1:])]
    assert 2.0 <= gaps[0] < 2.8 and 4.0 <= gaps[1] < 4.8, gaps
    dead = rpc.ok("queue", "q:0", "listDeadLetters")["data"][0]
    assert (dead["messageId"], dead["attempt"], dead["lastError"]) == ("msg_dead", 3, "HTTP 500")
    sink.answer(Answer(200))
    assert rpc.ok("queue", "q:0", "redriveDeadLetter", "msg_dead") == {"ok": True}
    assert sink.wait_for(4, 10)
    assert sink.requests[-1].attempt == "1"
    settled()
    assert rpc.ok("queue", "q:0", "stats") == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_delivers_every_message_from_32_concurrent_enqueuers_on_2_shards(sink, worker):
    lock = threading.Lock()
    seen: Counter[str] = Counter()
    successes: Counter[str] = Counter()

    def script(rec):
        mid = rec.message_id
        n = int(mid.split("-")[1])
        with lock:
            seen[mid] += 1
            first = seen[mid] == 1
            if n % 10 == 0 and first:
                return Answer(503, {"timeoutSeconds": 0})
            if n % 25 == 0 and first:
                return Answer(500)
            successes[mid] += 1
        return Answer(200)

    sink.script(script)
    per_client = 10

    def client(c):
        try:
            out = []
            for j in range(per_client):
                n = c * per_client + j
                out.append(enqueue(f"q:{n % 2}", messageId=f"m-{n}", idempotencyKey=f"k{n}", target=sink.url, shards=2))
            return out
        finally:
            connection.close()

    with ThreadPoolExecutor(32) as ex:
        results = [r for rs in ex.map(client, range(32)) for r in rs]
    total = 32 * per_client
    assert all(r["ok"] and not r["deduped"] for r in results)
    forced = {f"m-{n}" for n in range(total) if n % 10 == 0 or n % 25 == 0}
    wait_until(lambda: len(successes) == total, 60, f"{total} deliveries (got {len(successes)})")
    settled()
    assert set(successes.values()) == {1}  # 0 lost, no duplicate success
    assert {m for m, c in seen.items() if c > 1} == forced  # duplicates only where a retry was forced
    assert not DeadLetter.objects.exists()
    assert sum(QueueService(f"q:{s}").stats()["inflight"] for s in (0, 1)) == 0


def test_it_delivers_a_delay_longer_than_the_visibility_timeout_exactly_once(sink, worker, tmp_path, broker):
    # a second real worker whose broker visibility timeout (1 s) is shorter than the delay (4 s).
    # The timed wake-up is an immediate task (queueing.wake "No ETA tasks"): no worker holds it
    # until it is due, so Redis has nothing to hand out again; the database decides
    import redis

    extra = start_worker(tmp_path, "short-visibility", visibility_timeout=1)
    held_etas: list = []
    try:
        t0 = time.time()
        enqueue("q:0", messageId="msg_late", delaySeconds=4, target=sink.url)
        r = redis.Redis.from_url(session_redis().url)
        time.sleep(0.5)
        while time.time() - t0 < 3.5:
            for raw in r.hgetall("unacked").values():
                held_etas.append(json.loads(raw)[0]["headers"].get("eta"))
            time.sleep(0.1)
        assert sink.wait_for(1, 15)
        time.sleep(3)
        assert sink.count() == 1
        assert sink.requests[0].at - t0 >= 3.99
        settled()
    finally:
        extra.stop()
    receipts = re.findall(r"Task queueing\.tasks\.wake_cell\[([0-9a-f-]+)\] received", extra.text() + worker.text())
    assert receipts, "no wake-up was sent"
    assert max(Counter(receipts).values()) == 1, "a wake-up was handed out twice"
    # a prefetched immediate wake-up may sit unacknowledged briefly, but none carries an ETA
    assert all(eta is None for eta in held_etas), held_etas


def test_it_redelivers_a_claim_whose_delivery_task_was_lost_once_its_deadline_passes(sink, worker, tmp_path):
    from queueing import machine
    from worldcell import clock

    enqueue("q:1", messageId="msg_lost", target=sink.url, delaySeconds=3600)
    # claimed, but the delivery task never reached a worker; the claim's deadline is 1.5 s away
    deadline = clock.now_ms() + 1_500
    Message.objects.update(due_at=None, inflight_deadline=deadline, claim_token="lost-task")
    QueueCell.objects.filter(name="q:1").update(alarm_at=deadline)
    beat = start_beat(tmp_path)
    try:
        assert sink.wait_for(1, 15)
        assert sink.requests[0].at * 1000 >= deadline
        assert sink.requests[0].attempt == "1"  # a lost claim is not a counted attempt
        settled()
    finally:
        beat.stop()
    assert machine.cell_stats("q:1") == {"pending": 0, "inflight": 0, "deadLetters": 0, "alarmAt": None}


def test_it_delivers_after_rearm_alarms_when_the_alarm_was_cleared_by_hand(sink, worker, capsys):
    enqueue("q:0", messageId="msg_rearm", target=sink.url, delaySeconds=0.5)
    QueueCell.objects.update(alarm_at=None)
    time.sleep(1.5)  # its timed wake-up found no alarm: nothing delivered
    assert sink.count() == 0
    call_command("rearm_alarms")
    out = capsys.readouterr().out
    assert "q:0: pending=1 inflight=0 deadLetters=0" in out and "alarm None ->" in out
    assert sink.wait_for(1, 10)
    settled()


@pytest.mark.slow
@pytest.mark.slow(reason="two beats hammer the alarms for 30 s of real time")
def test_it_never_delivers_twice_with_two_beats_hammering_for_30_seconds(sink, worker, tmp_path):
    lock = threading.Lock()
    successes: Counter[str] = Counter()
    posts: Counter[str] = Counter()

    def script(rec):
        with lock:
            posts[rec.message_id] += 1
            if posts[rec.message_id] == 1 and hash(rec.message_id) % 7 == 0:
                return Answer(503, {"timeoutSeconds": 1})
            successes[rec.message_id] += 1
        return Answer(200)

    sink.script(script)
    beats = [start_beat(tmp_path, "beat-a"), start_beat(tmp_path, "beat-b")]
    sent = []
    try:
        rng = random.Random(7)
        deadline = time.monotonic() + 30
        i = 0
        while time.monotonic() < deadline:
            delay = rng.choice([0, 0, 0.5, 1, 2.5])
            mid = f"h-{i}"
            enqueue(f"q:{i % 2}", messageId=mid, target=sink.url, shards=2, delaySeconds=delay)
            sent.append(mid)
            i += 1
            time.sleep(0.05)
        wait_until(lambda: len(successes) == len(sent), 30, "every delivery")
        settled()
    finally:
        for b in beats:
            b.stop()
    assert set(successes) == set(sent)
    assert max(successes.values()) == 1
    assert "fire_due_alarms" in beats[0].text() and "fire_due_alarms" in beats[1].text()
    assert not DeadLetter.objects.exists()
