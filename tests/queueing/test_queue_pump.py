"""The in-process pump in real time — the queue's driver without a broker (devfleet, SQLite):
wake on commit, the in-flight cap, prompt re-claims, delays, stop, and concurrency
(docs/protocol.md §7.4, §9.1, §9.2; §11.6 items 56, 66; §12 A14)."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from queueing import delivery, machine
from queueing.models import DeadLetter, Message
from queueing.models import QueueCell as QueueCellRow
from queueing.pump import LocalPump
from queueing.service import QueueCell
from tests.services import in_thread
from .support import Answer, enqueue_request, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pump():
    started: list[LocalPump] = []

    def start(**kw) -> LocalPump:
        p = LocalPump(**kw).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop(5)



def test_it_delivers_right_after_the_enqueue_commits_without_waiting_for_a_tick(rpc, sink, pump):
    pump(interval_s=30)  # ticks are far apart: only the on-commit wake can deliver quickly
    t0 = time.monotonic()
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="fast", target=sink.url))
    assert sink.wait_for(1, 5)
    assert time.monotonic() - t0 < 2.0
    wait_until(lambda: not Message.objects.exists(), 5, "the ack")


def test_it_claims_at_most_max_inflight_per_cell_then_the_rest(rpc, sink, pump):
    sink.hold()
    p = pump(interval_s=0.02, max_workers=16)
    for i in range(8):
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId=f"m{i}", target=sink.url))
    assert sink.wait_for(5, 10)
    time.sleep(0.3)
    assert sink.count() == 5 and sink.peak == 5
    stats = rpc.ok("queue", "q:0", "stats")
    assert (stats["pending"], stats["inflight"]) == (3, 5)
    sink.release()
    assert sink.wait_for(8, 10)
    assert p.wait_idle(10)
    wait_until(lambda: not Message.objects.exists(), 5, "all acks")
    assert sink.peak <= 5
    assert sorted(Counter(r.message_id for r in sink.requests).values()) == [1] * 8


def test_it_claims_the_next_message_as_soon_as_a_slot_frees(rpc, sink, pump, settings):
    settings.QUEUE_MAX_INFLIGHT = "1"
    pump(interval_s=30)  # no ticks: only wake-ups (enqueue, freed slot) drive it
    for i in range(6):
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId=f"m{i}", target=sink.url))
    assert sink.wait_for(6, 10), sink.count()
    assert sink.peak == 1
    assert [r.message_id for r in sink.requests] == [f"m{i}" for i in range(6)]


def test_it_redelivers_a_503_timeout_zero_immediately_without_counting(rpc, sink, pump):
    sink.answer(Answer(503, {"timeoutSeconds": 0}), Answer(503, {"timeoutSeconds": 0}), Answer(200))
    pump(interval_s=30)
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="m", target=sink.url))
    assert sink.wait_for(3, 5)
    assert [r.attempt for r in sink.requests] == ["1", "1", "1"]
    wait_until(lambda: not Message.objects.exists(), 5, "the ack")
    assert not DeadLetter.objects.exists()


def test_it_delivers_a_short_delay_on_time(rpc, sink, pump):
    pump()
    t0 = time.time()
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="later", delaySeconds=0.4, target=sink.url))
    assert sink.wait_for(1, 5)
    waited = sink.requests[0].at - t0
    assert 0.39 <= waited < 1.5, waited


def test_it_logs_one_line_per_delivery(rpc, sink, pump, caplog):
    with caplog.at_level(logging.INFO, logger="queueing.pump"):
        p = pump(log_deliveries=True)
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="logged", target=sink.url))
        assert sink.wait_for(1, 5)
        assert p.wait_idle(5)
    lines = [r.getMessage() for r in caplog.records if r.name == "queueing.pump"]
    assert len(lines) == 1
    assert lines[0].startswith("queue q:0 logged attempt=1 -> 200 acked (") and lines[0].endswith(" ms)")


def test_it_stops_claiming_and_leaves_unfinished_deliveries_to_their_deadline(rpc, sink, pump):
    sink.hold()
    p = pump(max_workers=2)
    for i in range(3):
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId=f"m{i}", target=sink.url))
    assert sink.wait_for(2, 5)
    workers = list(p._workers)
    assert p.stop(timeout_s=0.2) == 2  # two POSTs open; m2 was never claimed (no idle thread)
    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="after-stop", target=sink.url))
    stats = rpc.ok("queue", "q:0", "stats")
    assert (stats["pending"], stats["inflight"]) == (2, 2)
    sink.release()
    for t in workers:
        t.join(5)
    time.sleep(0.2)
    assert sorted(r.message_id for r in sink.requests) == ["m0", "m1"]
    stats = rpc.ok("queue", "q:0", "stats")
    assert (stats["pending"], stats["inflight"]) == (2, 0)  # the stopped pump claimed nothing new


def test_it_never_claims_more_than_its_idle_threads(rpc, sink, pump):
    """A claim waiting in the pump for a thread would burn its deadline: due work stays pending instead."""
    sink.hold()
    p = pump(max_workers=2)
    for i in range(5):
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId=f"m{i}", target=sink.url))
    assert sink.wait_for(2, 5)
    time.sleep(0.3)  # ticks keep running: nothing more may be claimed
    stats = rpc.ok("queue", "q:0", "stats")
    assert (stats["pending"], stats["inflight"]) == (3, 2)
    assert p.outstanding == 2
    sink.release()
    assert sink.wait_for(5, 10)
    wait_until(lambda: not Message.objects.exists(), 5, "all acks")
    assert sink.peak <= 2 and sink.count() == 5


def test_it_serves_other_cells_while_one_cell_has_slow_targets(rpc, sink, pump):
    """Two threads, a cell whose target takes 0.4 s per message, then a cell with a fast target:
    the fast cell's messages go out as soon as a thread frees, not after the slow cell's backlog."""

    def script(rec):
        if rec.message_id.startswith("slow"):
            time.sleep(0.4)
        return Answer(200)

    sink.script(script)
    pump(max_workers=2)
    for i in range(6):
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId=f"slow{i}", target=sink.url))
    assert sink.wait_for(2, 5)
    for i in range(2):
        rpc.ok("queue", "q:1", "enqueue", enqueue_request(messageId=f"fast{i}", target=sink.url))
    assert sink.wait_for(8, 15)
    order = [r.message_id for r in sink.requests]
    assert order.index("fast0") < order.index("slow3") and order.index("fast1") < order.index("slow4"), order
    wait_until(lambda: not Message.objects.exists(), 5, "all acks")


def test_it_delivers_every_message_from_32_concurrent_enqueuers_on_2_shards(sink, pump):
    forced = {}
    lock = threading.Lock()

    def script(rec):
        mid = rec.message_id
        n = int(mid.split("-")[1])
        with lock:
            seen = forced.get(mid, 0)
            forced[mid] = seen + 1
        if n % 10 == 0 and seen == 0:
            return Answer(503, {"timeoutSeconds": 0})
        if n % 15 == 0 and seen == 0:
            return Answer(500)
        return Answer(200)

    sink.script(script)
    pump(max_workers=10)
    per_client = 8

    @in_thread
    def client(c):
        out = []
        for j in range(per_client):
            n = c * per_client + j
            key = f"k{n}"
            shard = n % 2
            out.append(
                QueueCell(f"q:{shard}").enqueue(
                    enqueue_request(messageId=f"m-{n}", idempotencyKey=key, target=sink.url, shards=2)
                )
            )
        return out

    with ThreadPoolExecutor(32) as ex:
        results = [r for rs in ex.map(client, range(32)) for r in rs]
    total = 32 * per_client
    assert all(r["ok"] and not r["deduped"] for r in results)
    retried = {f"m-{n}" for n in range(total) if n % 10 == 0 or n % 15 == 0}
    assert sink.wait_for(total + len(retried), 60), (sink.count(), total + len(retried))
    wait_until(lambda: not Message.objects.exists(), 10, "all acks")
    time.sleep(0.2)
    counts = Counter(r.message_id for r in sink.requests)
    assert len(counts) == total  # 0 lost
    assert {m for m, c in counts.items() if c > 1} == retried  # duplicates only where forced
    assert all(c == 2 for m, c in counts.items() if m in retried)
    assert not DeadLetter.objects.exists()


def test_it_never_delivers_twice_under_two_hammering_alarm_loops(sink):
    """Two fire_due_alarms loops (two beats / overlapping ticks) race for 3 s while messages arrive."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(12)

    @in_thread
    def deliver(claim):
        delivery.deliver_claim(claim)

    def dispatch(claims):
        for c in claims:
            pool.submit(deliver, c)

    @in_thread
    def alarm_loop():
        while not stop.is_set():
            machine.fire_due_alarms(dispatch=dispatch)

    @in_thread
    def producer(p):
        for i in range(40):
            QueueCell(f"q:{i % 2}").enqueue(
                enqueue_request(messageId=f"p{p}-{i}", target=sink.url, shards=2, delaySeconds=(i % 3) * 0.2)
            )
            time.sleep(0.01)

    loops = [threading.Thread(target=alarm_loop) for _ in range(2)]
    for t in loops:
        t.start()
    try:
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(producer, range(4)))
        assert sink.wait_for(160, 30), sink.count()
        time.sleep(1.0)  # keep hammering after the last delivery
    finally:
        stop.set()
        for t in loops:
            t.join(10)
        pool.shutdown(wait=True)
    counts = Counter(r.message_id for r in sink.requests)
    assert len(counts) == 160 and max(counts.values()) == 1
    assert not Message.objects.exists()


def test_it_counts_an_alarm_re_armed_during_its_scan_as_due(rpc, sink, monkeypatch):
    """An enqueue re-arms an overdue alarm to its own now + 1 (§7.8) and, its cell's alarm being
    due already, sends no wake-up: a tick that read its clock before the scan would see that alarm
    1 ms in the future, skip the cell, and nothing would wake it again."""
    from .support import VirtualClock

    vclock = VirtualClock().install()
    try:
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="m", target=sink.url))
        real = machine.cell_alarms

        def scan_while_an_enqueue_commits(at):
            vclock.advance(1)
            QueueCellRow.objects.filter(name="q:0").update(alarm_at=vclock.now + 1)
            return real(at)

        monkeypatch.setattr(machine, "cell_alarms", scan_while_an_enqueue_commits)
        p = LocalPump(max_workers=2, register=False)
        assert p.tick() == 1
        claim = p._jobs.get_nowait()
        assert claim.message_id == "m" and claim.started is not None  # claimed and started for the pump's thread
    finally:
        vclock.uninstall()


def test_it_fires_a_cell_whose_alarm_was_re_armed_during_the_pre_check(rpc, sink, monkeypatch):
    from .support import VirtualClock

    vclock = VirtualClock().install()
    try:
        rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="m", target=sink.url))
        real = machine._cell_state

        def state_while_an_enqueue_commits(name):
            vclock.advance(1)
            QueueCellRow.objects.filter(name=name).update(alarm_at=vclock.now + 1)
            return real(name)

        monkeypatch.setattr(machine.claim, "_cell_state", state_while_an_enqueue_commits)
        assert [c.message_id for c in machine.fire_cell_alarm("q:0", early_ms=1, skip_locked=True)] == ["m"]
    finally:
        vclock.uninstall()


def test_it_retries_a_due_cell_it_found_locked(rpc, sink):
    """A tick that finds a due cell locked (SKIP LOCKED) comes back a few ms later: the lock
    holder may be an enqueue that, the alarm being due already, sends no wake-up of its own."""
    from django.db import connections, transaction

    rpc.ok("queue", "q:0", "enqueue", enqueue_request(messageId="m", target=sink.url))  # due; nobody listens
    p = LocalPump(interval_s=30, max_workers=2, register=False).start()
    held, release = threading.Event(), threading.Event()

    def hold_the_cell():
        try:
            with transaction.atomic():
                machine._lock_cell("q:0")
                held.set()
                release.wait(5)
        finally:
            connections["default"].close()

    holder = threading.Thread(target=hold_the_cell)
    holder.start()
    try:
        assert held.wait(5)
        p.wake("q:0")  # the only poke: it meets the lock
        time.sleep(0.15)
        release.set()
        holder.join(5)
        assert sink.wait_for(1, 3), "the locked cell was never fired again"
    finally:
        release.set()
        p.stop(5)
