"""Fault-test tooling of the queue tests: a broker switch for this process and a ledger of deliveries.

* ``use_broker(url)`` — point this process's Celery app (its wake-up sends) at ``url``.
* ``Ledger`` — a sink script that records every POST and success per message id.
* ``FAULT_MARKS`` — the marks every fault and chaos module carries.

The private redis-server, the Celery processes, their environment and the test
database URL come from ``tests/services.py`` (defined once for every test).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable

import pytest

from tests.services import redis_available

from .support import Answer, Recorded

#: the marks of every fault and chaos module: a real Celery fleet (worker and beat subprocesses)
#: against PostgreSQL and a private redis-server; each module adds its own time limit
FAULT_MARKS = [
    pytest.mark.celery,
    pytest.mark.postgres_only,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not redis_available(), reason="needs redis-server"),
]


def use_broker(url: str) -> Callable[[], None]:
    """Point this process's Celery app at broker ``url`` (sends included); returns the undo.

    Celery resolves ``broker_write_url`` from ``broker_url`` once and caches its
    connection and producer pools, so all of them are reset.
    """
    from worldcell.celery import app

    old = app.conf.broker_url, app.conf.broker_write_url

    def point(broker_url: str, write_url: str) -> None:
        app.conf.broker_url, app.conf.broker_write_url = broker_url, write_url
        app._pool = None
        app.amqp._producer_pool = None

    point(url, url)
    return lambda: point(*old)


class Ledger:
    """Records every POST and every 2xx answer per message id; ``script`` picks the answer.

    Use as an ``HttpSink.script``: ``sink.script(ledger)``. ``decide(rec, nth)``
    (``nth`` = 1 for the first POST of that message) returns the ``Answer``;
    the default answers 200.
    """

    def __init__(self, decide: Callable[[Recorded, int], Answer] | None = None):
        self.decide = decide or (lambda rec, nth: Answer(200))
        self.lock = threading.Lock()
        self.posts: Counter[str] = Counter()
        self.successes: Counter[str] = Counter()
        self.first_success_at: dict[str, float] = {}

    def __call__(self, rec: Recorded) -> Answer:
        mid = rec.message_id or "?"
        with self.lock:
            self.posts[mid] += 1
            nth = self.posts[mid]
        answer = self.decide(rec, nth)
        if 200 <= answer.status <= 299:
            with self.lock:
                self.successes[mid] += 1
                self.first_success_at.setdefault(mid, time.time())
        return answer

    def duplicates(self) -> dict[str, int]:
        """Message ids answered 2xx more than once, with their count."""
        with self.lock:
            return {m: n for m, n in self.successes.items() if n > 1}
