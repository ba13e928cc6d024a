"""Faults of the Celery fleet: broker loss, a killed worker, a delivery longer than a lease
(docs/operations-faults.md, docs/leases.md; claims: docs/protocol.md §7.4, §7.7).

Real Celery workers (threads pool) and beat run as subprocesses against the
test database and a PRIVATE redis-server (``tests.fault_support``) that the
tests kill and restart; this process enqueues through the queue service, so
its wake-ups go through that broker too. Every test reports its figures on
stdout (``-s``) and in the assertion messages.
"""
from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection

from queueing import wake
from queueing.models import DeadLetter, Message
from queueing.service import QueueCell as QueueService
from tests.services import CeleryProc, private_redis, process_env, test_database_url, wait_until
from .fault_support import FAULT_MARKS, Ledger, use_broker
from .support import Answer, enqueue_request

pytestmark = [*FAULT_MARKS, pytest.mark.timeout(240)]


@pytest.fixture
def broker(tmp_path):
    """A private redis-server, and this process's Celery app pointed at it."""
    with private_redis(log=tmp_path / "redis.log") as server:
        undo = use_broker(server.url)
        yield server
        undo()


@pytest.fixture
def use_celery(settings):
    settings.WORLDCELL_USE_CELERY = True


@pytest.fixture
def fleet(tmp_path, broker, use_celery):
    """Start workers and beat with ``start(kind, name, **env)``; stops them all afterwards."""
    procs: list[CeleryProc] = []

    def start(kind: str, name: str, **extra: str) -> CeleryProc:
        env = process_env(test_database_url("wc-fleet"), tmp_path, broker_url=broker.url, **extra)
        p = CeleryProc(kind, name, tmp_path, env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def stop_every_pump_in_this_process() -> list[str]:
    """Stop every ``LocalPump`` still running in this (test) process; returns a line per pump stopped.

    This process stands for an API process, which runs no pump. An earlier test may have left
    one ticking (e.g. ``queueing.tasks.worker_pump()``, started by calling a task in-process, or
    a pump whose ``stop`` timed out): unregistered or not, its tick would fire the cells this test
    leaves to beat. ``gc`` finds them whether or not ``wake`` knows them.
    """
    import gc

    from queueing import tasks
    from queueing.pump import LocalPump

    stopped = []
    for obj in gc.get_objects():
        if isinstance(obj, LocalPump) and (obj._loop is not None or obj._workers):
            stopped.append(f"interval {obj.interval_s}s registered={wake.current_pump() is obj}")
            obj.stop(5)
    if tasks._pump is not None and tasks._pump._loop is None:
        tasks._pump = None
    leftover = wake.current_pump()
    if leftover is not None:
        wake.unregister_pump(leftover)
    alive = [t.name for t in threading.enumerate() if t.name == "queue-pump"]
    assert not alive, f"a pump tick thread survived stop(): {alive}"
    return stopped


def enqueue(cell: str, **over):
    return QueueService(cell).enqueue(enqueue_request(**over))


def no_live_messages() -> bool:
    return not Message.objects.exists()


def no_claim_in_flight() -> bool:
    return not Message.objects.filter(inflight_deadline__isnull=False).exists()


# --------------------------------------------------------------------------- broker loss


@pytest.mark.slow(reason="the broker stays down for 10 s of real time, then every message must land")
@pytest.mark.parametrize("worker_tick_ms", ["1000", "600000"], ids=["pump-ticks", "beat-alone"])
def test_the_worker_rides_out_a_10_second_broker_outage_and_loses_nothing(fleet, broker, sink, worker_tick_ms):
    """200 messages; Redis killed 10 s mid-run (its queued tasks are lost) and restarted.

    ``pump-ticks``: the worker's pump ticks every second on its own, so it keeps
    delivering through the outage. ``beat-alone``: the pump ticks only when
    woken, so after the broker's return beat's ticks must catch up on their own.
    """
    rng = random.Random(13)
    # this test process stands for an API process: no pump of its own (a pump an earlier test
    # left registered would deliver the enqueues in-process and hide what the worker does)
    stopped = stop_every_pump_in_this_process()

    def decide(rec, nth):
        if nth == 1 and int(rec.message_id.split("-")[1]) % 10 == 0:
            return Answer(503, {"timeoutSeconds": 1})  # a redelivery timed by the worker itself
        return Answer(200)

    ledger = Ledger(decide)
    sink.script(ledger)
    # beat-alone: a claim's lease deadline is also an alarm of its cell, which the worker's pump
    # keeps as a timed tick (queueing.wake); with the default 10 s lease the claims of the first
    # half would fire the idle cells mid-outage. A 10-minute lease leaves the second half to beat.
    lease = {} if worker_tick_ms == "1000" else {"QUEUE_CLAIM_LEASE_MS": "600000"}
    worker = fleet("worker", "w1", QUEUE_WORKER_TICK_MS=worker_tick_ms, **lease)
    beat = fleet("beat", "beat")
    worker_pid = worker.pid
    total = 200
    accepted: list[str] = []
    due_at: dict[str, float] = {}
    enqueue_ms: list[float] = []
    outage: dict[str, float] = {}

    first_half_done, outage_started, second_half_done = threading.Event(), threading.Event(), threading.Event()

    def producer():
        # phases by events, not by sleeps, so a slow machine cannot shift them: the first half goes
        # in while deliveries run (the outage starts during it); the second half only once the
        # broker is down, no claim is in flight and every timed tick the worker may have been
        # asked for (delays ≤ 2 s, 503 redeliveries after 1 s) has passed, so with
        # QUEUE_WORKER_TICK_MS=600000 only beat, through the restored broker, can deliver it
        try:
            for i in range(total):
                if i == total // 2:
                    first_half_done.set()
                    outage_started.wait(60)
                    wait_until(no_claim_in_flight, 60, "no claim in flight")
                    time.sleep(3)
                mid = f"b-{i}"
                t0 = time.monotonic()
                delay = rng.choice([0, 0, 0, 0.5, 2])
                r = enqueue(f"q:{i % 2}", messageId=mid, target=sink.url, shards=2, delaySeconds=delay)
                enqueue_ms.append((time.monotonic() - t0) * 1000)
                if r["ok"]:
                    accepted.append(mid)
                    due_at[mid] = time.time() + delay
                time.sleep(0.04)  # 2 x 4 s of enqueues
        finally:
            second_half_done.set()
            connection.close()

    t = threading.Thread(target=producer)
    t.start()
    first_half_done.wait(2.5)
    outage["start"] = time.time()
    broker.kill()  # an outage: whatever Redis held is lost
    outage_started.set()
    second_half_done.wait(90)
    time.sleep(max(0.0, outage["start"] + 10 - time.time()))  # down for at least 10 s
    broker.start()
    outage["end"] = time.time()
    t.join(60)
    assert len(accepted) == total  # every enqueue was accepted, broker or not
    wait_until(lambda: len(ledger.successes) == total, 90, f"{total} deliveries (got {len(ledger.successes)})")
    wait_until(no_live_messages, 20, "every message acked")
    late = {m: ledger.first_success_at[m] - due_at[m] for m in accepted}
    due_before_return = [m for m in accepted if due_at[m] <= outage["end"]]
    recovery_s = max(0.0, max(ledger.first_success_at[m] for m in due_before_return) - outage["end"])
    due_in_outage = [m for m in due_before_return if due_at[m] > outage["start"]]
    dups = ledger.duplicates()
    print(f"\n[broker-loss {worker_tick_ms}] delivered={len(ledger.successes)}/{total} lost=0 "
          f"duplicates={len(dups)} recovery_after_return_s={recovery_s:.1f} "
          f"max_late_s(due in outage)={max(late[m] for m in due_in_outage):.1f} max_late_s={max(late.values()):.1f} "
          f"max_enqueue_ms={max(enqueue_ms):.0f} worker_pid_same={worker.pid == worker_pid and worker.alive()}")
    assert worker.alive() and worker.pid == worker_pid, worker.text()[-3000:]
    assert beat.alive(), beat.text()[-3000:]
    assert not DeadLetter.objects.exists()
    assert dups == {}
    assert "Unrecoverable error" not in worker.text()
    assert max(enqueue_ms) < 1_000  # a wake-up never holds the enqueue (queueing.outbox)
    assert due_in_outage
    if worker_tick_ms == "1000":
        # delivered through the outage: what was due during it went out within a few ticks
        assert max(late.values()) < 5  # includes 503 {"timeoutSeconds": 1} redeliveries
    else:
        # the second half was enqueued into idle cells while the broker was down: nothing woke the
        # worker until beat's ticks (and later wake-ups) came through the restored broker
        # the second half was enqueued into idle cells while the broker was down: no wake-up
        # reached the worker, and with a 10-minute lease it holds no timed tick for those cells,
        # so beat's ticks through the restored broker delivered it
        second_half = accepted[total // 2:]
        early = sorted(m for m in second_half if ledger.first_success_at[m] <= outage["end"])
        print(f"[broker-loss beat-alone] second half delivered after the broker's return: "
              f"{len(second_half) - len(early)}/{len(second_half)} (pumps of earlier tests stopped first: {stopped})")
        assert not early, (early, stopped)
        assert recovery_s < 40  # the consumer's reconnect backoff (≤ 30 s) + a beat tick


# --------------------------------------------------------------------------- a killed worker (leases)


@pytest.mark.slow(reason="a killed claim is only recovered after its 10 s default lease lapses")
def test_a_killed_workers_in_flight_message_is_redelivered_within_15_seconds(fleet, sink):
    """Default settings (``QUEUE_CLAIM_LEASE_MS`` 10 000): kill -9 mid-delivery -> another worker redelivers."""
    held = threading.Event()

    def decide(rec, nth):
        if nth == 1:
            held.wait(120)  # the first POST never gets an answer to its worker
        return Answer(200)

    ledger = Ledger(decide)
    sink.script(ledger)
    victim = fleet("worker", "victim")
    fleet("beat", "beat")
    try:
        enqueue("q:0", messageId="inflight", target=sink.url)
        assert sink.wait_for(1, 15), victim.text()[-2000:]
        survivor = fleet("worker", "survivor")
        killed_at = time.time()
        victim.kill9()
        assert sink.wait_for(2, 30), survivor.text()[-2000:]
        redelivered_s = sink.requests[1].at - killed_at
        print(f"\n[kill -9 mid-delivery] redelivered after {redelivered_s:.1f} s (lease 10 s)")
        assert redelivered_s < 15
        assert [r.attempt for r in sink.requests] == ["1", "1"]  # a lost claim is not a counted attempt
        wait_until(no_live_messages, 10, "the redelivery to be acked")
        assert not DeadLetter.objects.exists()
        assert ledger.successes["inflight"] == 1
    finally:
        held.set()


@pytest.mark.slow(reason="the delivery takes 60 s so that six 10 s leases must be renewed")
def test_a_60_second_delivery_on_a_live_worker_is_delivered_exactly_once(fleet, sink):
    """The sink answers after 60 s (timeout 90 s, lease 10 s): renewals keep the claim; a second worker
    and beat fire the cell's alarm all along and never redeliver."""
    ledger = Ledger(lambda rec, nth: (time.sleep(60), Answer(200))[1])
    sink.script(ledger)
    env = {"QUEUE_DELIVERY_TIMEOUT_MS": "90000"}
    workers = [fleet("worker", "holder", **env), fleet("worker", "rival", **env)]
    fleet("beat", "beat")
    t0 = time.time()
    enqueue("q:0", messageId="slow", target=sink.url)
    wait_until(lambda: ledger.successes["slow"] == 1, 90, "the slow delivery")
    wait_until(no_live_messages, 10, "the slow delivery to be acked")
    time.sleep(2)
    took = time.time() - t0
    print(f"\n[60 s delivery] posts={ledger.posts['slow']} acked after {took:.0f} s")
    assert ledger.posts == {"slow": 1}
    assert took >= 60
    assert not any("lost claim" in w.text() for w in workers)  # no claim was ever recovered
