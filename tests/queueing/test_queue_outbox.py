"""The wake-up outbox: an enqueue never waits for the broker (docs/operations-faults.md "Broker loss")."""
from __future__ import annotations

import threading
import time

from queueing import outbox as outbox_mod
from queueing.outbox import WakeOutbox


class Broker:
    """A publisher that behaves like a Celery send: fast when up, blocking then raising when down."""

    def __init__(self) -> None:
        self.up = True
        self.sent: list[tuple[str, int | None]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, at_ms: int | None) -> None:
        if not self.up:
            time.sleep(0.3)  # kombu's connect timeout + retry interval, shortened
            raise ConnectionRefusedError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        with self.lock:
            self.sent.append((name, at_ms))


def test_it_sends_wake_ups_in_order_off_the_callers_thread():
    broker = Broker()
    box = WakeOutbox(broker)
    for i in range(50):
        box.put(f"q:{i % 2}", None if i % 3 else 1_000 + i)
    assert box.flush(5)
    assert broker.sent == [(f"q:{i % 2}", None if i % 3 else 1_000 + i) for i in range(50)]
    assert (box.sent, box.dropped) == (50, 0)


def test_with_the_broker_down_puts_never_block_and_one_failure_pauses_sending(monkeypatch):
    monkeypatch.setattr(outbox_mod, "BROKER_DOWN_PAUSE_S", 0.5)
    broker = Broker()
    box = WakeOutbox(broker)
    broker.up = False
    t0 = time.monotonic()
    for i in range(200):
        box.put("q:0", None)
        time.sleep(0.001)
    put_s = time.monotonic() - t0
    assert put_s < 1.0  # 200 puts while every publish blocks 0.3 s and fails
    assert box.flush(5)
    assert box.sent == 0 and box.dropped == 200
    broker.up = True
    time.sleep(0.6)  # the pause is over: the next wake-up goes out
    box.put("q:1", 5)
    assert box.flush(5)
    assert broker.sent == [("q:1", 5)]
