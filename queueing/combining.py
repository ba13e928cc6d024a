"""Combining concurrent transitions of one queue cell into one transaction (flat combining).

Every transition of a cell holds the cell's lock for its whole transaction
(docs/architecture.md rule 1), including the client round trips of each statement and
the commit's WAL flush. Under load the lock, not the database, is the limit:
on a busy two-core machine a four-statement transaction holds it for 10–25 ms
because each round trip waits for the holding thread to be scheduled again.
Threads of one process that want to run the same kind of transition on the
same cell at the same time therefore hand their work to one of them, which
runs it for all in ONE transaction: one lock acquisition, one multi-row
statement where possible, one commit. The others wait for their results.

``Combiner(run_batch).submit(key, item)`` returns ``item``'s result:

* the first thread to submit for ``key`` becomes the *leader*; it takes every
  item queued for ``key`` (at most ``max_batch``), calls
  ``run_batch(key, items)`` -> one result per item, and hands each result
  (or the exception ``run_batch`` raised, to every item of the batch) to
  its thread;
* items submitted meanwhile queue up; when the batch is done, the leader
  promotes the oldest waiting thread to lead the next batch and returns
  (it never serves others for longer than one batch);
* a batch is all-or-nothing like any transaction: if it fails, every item
  of it gets the exception and nothing of it is committed, so each caller
  may retry exactly as after a failed transaction of its own.

Callers must only submit work that may share a transaction with strangers:
never from inside an ``atomic`` block (the leader's outer transaction would
swallow the others' commits) — ``submit`` checks that and runs the item
alone instead.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

from django.db import connection

__all__ = ["Combiner"]

T = TypeVar("T")
R = TypeVar("R")


class _Item(Generic[T]):
    __slots__ = ("value", "result", "error", "done", "lead", "wake")

    def __init__(self, value: T) -> None:
        self.value = value
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False
        self.wake = threading.Event()


class Combiner(Generic[T, R]):
    """Runs items submitted concurrently for the same key in batches, one batch at a time per key.

    Args:
        run_batch: ``(key, [item, …]) -> [result, …]`` (same length and order);
            runs in the leading submitter's thread, typically one transaction.
        max_batch: most items in one batch (bounds statement size).
    """

    def __init__(self, run_batch: Callable[[Hashable, list[T]], Sequence[R]], max_batch: int = 64) -> None:
        self._run_batch = run_batch
        self.max_batch = max(1, max_batch)
        self._lock = threading.Lock()
        self._queues: dict[Hashable, list[_Item[T]]] = {}
        self._leading: set[Hashable] = set()
        self.batches = 0  # batches run (for tests and observers)
        self.items = 0  # items run in them

    def submit(self, key: Hashable, value: T) -> R:
        """Run ``value`` in a batch with whatever else is waiting for ``key``; its result (or its batch's error)."""
        if connection.in_atomic_block:
            return self._run_batch(key, [value])[0]
        item = _Item(value)
        with self._lock:
            self._queues.setdefault(key, []).append(item)
            lead = key not in self._leading
            if lead:
                self._leading.add(key)
        if not lead:
            item.wake.wait()
            if not item.lead:
                return self._result(item)
        self._lead(key)
        return self._result(item)

    @staticmethod
    def _result(item: _Item[T]) -> Any:
        if item.error is not None:
            raise item.error
        return item.result

    def _lead(self, key: Hashable) -> None:
        with self._lock:
            queue = self._queues.get(key, [])
            batch, rest = queue[: self.max_batch], queue[self.max_batch :]
            if rest:
                self._queues[key] = rest
            else:
                self._queues.pop(key, None)
        try:
            results = self._run_batch(key, [i.value for i in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch of {len(batch)} items returned {len(results)} results")
            for i, r in zip(batch, results):
                i.result = r
        except BaseException as exc:  # noqa: BLE001 - every item of the batch gets the failure
            for i in batch:
                i.error = exc
        with self._lock:
            self.batches += 1
            self.items += len(batch)
            waiting = self._queues.get(key)
            if waiting:
                waiting[0].lead = True  # the oldest waiting thread leads the next batch
                waiting[0].wake.set()
            else:
                self._leading.discard(key)
        for i in batch:
            i.done = True
            i.wake.set()
