"""The fault-injection point of the runs cell's store (tests only; a no-op in production).

``LockedRunCell`` (``cells.run_store``) calls ``point(<name>)`` at the start
of each of its writes, named after the method: ``create_run``,
``update_run``, ``create_step``, ``update_step``, ``create_hook``,
``delete_hook``, ``release_all_hooks``, ``store_event``,
``save_event_sequence``, ``finish`` (just before the queued writes are sent).
A test arms one with ``inject(name, error)``: the next calls at that point
raise ``error``, as a crash of the process at that line would (the
transaction is then rolled back: docs/architecture.md rule 2).

    with faults.inject("store_event", RuntimeError("injected crash")):
        ...  # every applyEvent that appends an event fails here
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

__all__ = ["POINTS", "inject", "point"]

#: The named places ``point`` is called at.
POINTS = frozenset({
    "create_run", "update_run", "create_step", "update_step", "create_hook", "delete_hook",
    "release_all_hooks", "store_event", "save_event_sequence", "finish",
})

_armed: dict[str, BaseException] = {}


def point(name: str) -> None:
    """Raise the error armed at ``name``, if any (one dict check when none is armed)."""
    if _armed:
        error = _armed.get(name)
        if error is not None:
            raise error


@contextmanager
def inject(name: str, error: BaseException) -> Iterator[None]:
    """Arm ``point(name)`` to raise ``error`` inside the ``with`` block (any thread).

    Raises ValueError for a name that is not one of ``POINTS``.
    """
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {sorted(POINTS)}")
    _armed[name] = error
    try:
        yield
    finally:
        _armed.pop(name, None)
