"""Chaos on the real delivery path (docs/operations-faults.md "Chaos test"; issue 13 point 5).

PostgreSQL, a real Celery worker and beat (subprocesses) and a private
redis-server. While messages are enqueued (some delayed, some answered 503
``timeoutSeconds`` or slowly, so claims are in flight at every fault), the
test kills the worker with SIGKILL twice — a supervisor thread starts a new
one each time, as systemd's ``Restart=always`` would — kills and restarts
Redis, and terminates the fleet's PostgreSQL backends twice
(``pg_terminate_backend`` on the test database, fleet connections only).

Asserts: every accepted message was answered 2xx at least once, nothing is
dead or left in the queue, duplicates are counted and reported (at-least-once:
a 2xx whose ack transaction was cut, or a delivery cut by a kill, is POSTed
again), no worker died except the ones killed, beat never restarted, and the
whole run stays under 3 minutes.
"""
from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection

from queueing.models import DeadLetter, Message
from queueing.service import QueueCell as QueueService
from tests.services import CeleryProc, process_env, redis_service, test_database_url, wait_until
from .fault_support import FAULT_MARKS, Ledger, use_broker
from .support import Answer, HttpSink, enqueue_request

pytestmark = [*FAULT_MARKS, pytest.mark.timeout(180)]

FLEET_APP = "wc-chaos-fleet"
SHARDS = 4
TOTAL = 300


def terminate_fleet_backends() -> int:
    """``pg_terminate_backend`` every backend of the fleet on the test database; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            [FLEET_APP],
        )
        return cursor.fetchone()[0]


@pytest.mark.slow(reason="a scripted 30 s timeline of kills, a broker restart and cut connections")
def test_every_accepted_message_is_delivered_through_kills_broker_restarts_and_cut_db_connections(tmp_path, settings):
    started = time.monotonic()
    broker = redis_service(log=tmp_path / "redis.log").start()
    undo_broker = use_broker(broker.url)
    settings.WORLDCELL_USE_CELERY = True
    rng = random.Random(5)

    def decide(rec, nth):
        n = int(rec.message_id.split("-")[1])
        if nth == 1 and n % 12 == 0:
            return Answer(503, {"timeoutSeconds": 0.5})
        if n % 9 == 0:
            time.sleep(2)  # slow: in flight when a fault hits
        return Answer(200)

    ledger = Ledger(decide)
    sink = HttpSink()
    sink.script(ledger)
    env = process_env(test_database_url(FLEET_APP), tmp_path, broker_url=broker.url)
    workers: list[CeleryProc] = []
    beat: CeleryProc | None = None
    kills = 0
    stop = threading.Event()
    accepted: list[str] = []
    failed_enqueues: list[str] = []
    events: list[str] = []

    def supervisor():  # systemd Restart=always for the worker: no human involved
        while not stop.is_set():
            if not workers[-1].alive():
                workers.append(CeleryProc("worker", f"worker-{len(workers) + 1}", tmp_path, env))
                events.append(f"{time.monotonic() - started:.1f}s supervisor started worker-{len(workers)}")
            time.sleep(0.3)

    def producer():
        try:
            for i in range(TOTAL):
                mid = f"c-{i}"
                try:
                    r = QueueService(f"q:{i % SHARDS}").enqueue(
                        enqueue_request(messageId=mid, target=sink.url, shards=SHARDS,
                                        delaySeconds=rng.choice([0, 0, 0, 0.5, 1, 3]))
                    )
                    (accepted if r["ok"] else failed_enqueues).append(mid)
                except Exception as exc:  # noqa: BLE001 - an enqueue refused is not accepted; counted
                    failed_enqueues.append(f"{mid}: {exc}")
                    connection.close()
                time.sleep(0.13)  # ~40 s of enqueues
        finally:
            connection.close()

    try:
        workers.append(CeleryProc("worker", "worker-1", tmp_path, env))
        beat = CeleryProc("beat", "beat", tmp_path, env)
        beat_pid = beat.pid
        sup = threading.Thread(target=supervisor, daemon=True)
        sup.start()
        prod = threading.Thread(target=producer)
        prod.start()
        t0 = time.monotonic()

        def at(second: float, what: str, action) -> None:
            time.sleep(max(0.0, t0 + second - time.monotonic()))
            result = action()
            events.append(f"{time.monotonic() - started:.1f}s {what}" + (f" ({result})" if result is not None else ""))

        def kill_worker():
            nonlocal kills
            kills += 1
            workers[-1].kill9()

        at(5, "kill -9 worker", kill_worker)
        at(12, "redis killed", broker.kill)
        at(20, "redis restarted", lambda: broker.start() and None)
        at(25, "terminated fleet backends", terminate_fleet_backends)
        at(31, "kill -9 worker", kill_worker)
        at(37, "terminated fleet backends", terminate_fleet_backends)
        prod.join(90)
        produced_at = time.monotonic()
        wait_until(lambda: all(ledger.successes[m] >= 1 for m in accepted), 100,
                   f"every accepted message (got {sum(1 for m in accepted if ledger.successes[m])}/{len(accepted)})")
        wait_until(lambda: not Message.objects.exists(), 30, "an empty queue")
        settle_s = time.monotonic() - produced_at
        time.sleep(1)
        dups = ledger.duplicates()
        crashes = [w.name for w in workers[:-1] if "Unrecoverable error" in w.text()]
        report = (
            f"\n[chaos] accepted={len(accepted)}/{TOTAL} refused={len(failed_enqueues)} "
            f"delivered={sum(1 for m in accepted if ledger.successes[m])} lost=0 "
            f"duplicates={len(dups)} ({sum(dups.values()) - len(dups)} extra 2xx) posts={sum(ledger.posts.values())} "
            f"workers_started={len(workers)} kills={kills} settle_after_last_enqueue_s={settle_s:.1f} "
            f"total_s={time.monotonic() - started:.0f}\n  " + "\n  ".join(events)
        )
        print(report)
        assert len(accepted) + len(failed_enqueues) == TOTAL
        assert len(accepted) >= TOTAL * 0.9, report  # only enqueues cut by a terminated backend may fail
        assert not DeadLetter.objects.exists(), report
        assert not Message.objects.exists(), report
        assert len(workers) == kills + 1, report  # no worker died except the ones killed
        assert workers[-1].alive() and not crashes, report
        assert beat.alive() and beat.pid == beat_pid, report  # beat rode out everything by itself
        assert time.monotonic() - started < 170, report
    finally:
        stop.set()
        for w in workers:
            w.stop()
        if beat is not None:
            beat.stop()
        sink.close()
        broker.stop()
        undo_broker()
