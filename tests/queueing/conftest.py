"""Fixtures of the queue tests (``tests/queueing/``), defined once.

* ``vclock``, ``sink``, ``no_broker`` — from ``tests/queueing/support.py``
  (shared with ``tests/admin/``).
* every test here delivers in-process (``no_broker``) unless it is marked
  ``celery`` (``test_queue_celery`` runs a real worker).
* ``queue`` — ``queue.enqueue(**over)`` / ``queue.call(method, *args)`` /
  ``queue.stats()`` on cell ``q:0`` over the RPC route, targeting ``sink``;
  ``enqueue`` and ``stats`` are its two methods as fixtures.
"""
from __future__ import annotations

import pytest

from .support import DEADLINE_MS, enqueue_request, no_broker, sink, vclock  # noqa: F401  (fixtures)

Q = "q:0"


@pytest.fixture(autouse=True)
def in_process_driver(request):
    """``no_broker`` for every queue test not marked ``celery``."""
    if request.node.get_closest_marker("celery") is None:
        request.getfixturevalue("no_broker")


class Queue:
    """The queue binding of one cell over the RPC route, enqueueing to ``sink``."""

    def __init__(self, rpc, sink, cell: str = Q):
        self.rpc, self.sink, self.cell = rpc, sink, cell

    def enqueue(self, **over):
        over.setdefault("target", self.sink.url)
        return self.rpc.ok("queue", self.cell, "enqueue", enqueue_request(**over))

    def call(self, method, *args):
        return self.rpc.ok("queue", self.cell, method, *args)

    def stats(self):
        return self.call("stats")


@pytest.fixture
def claim_deadline_of_the_protocol(settings):
    """Pin the protocol's claim deadline, timeout + 30 000 ms (docs/protocol.md §7.4): a claim lease
    at least that long gives exactly that deadline (docs/leases.md). Modules opt in with
    ``pytest.mark.usefixtures("claim_deadline_of_the_protocol")``."""
    settings.QUEUE_CLAIM_LEASE_MS = str(DEADLINE_MS)


@pytest.fixture
def queue(rpc, sink, vclock) -> Queue:
    """``queue.enqueue(**over)``, ``queue.call(method, *args)`` on q:0 over the RPC route."""
    return Queue(rpc, sink)


@pytest.fixture
def enqueue(queue):
    """``enqueue(**over)`` -> the enqueue answer (``queue.enqueue``)."""
    return queue.enqueue


@pytest.fixture
def stats(queue):
    """``stats()`` -> the cell's stats (``queue.stats``)."""
    return queue.stats
