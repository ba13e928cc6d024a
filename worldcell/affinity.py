"""Pin a process (every one of its threads) to one CPU core (docs/operations.md "One core per process").

A CPython process runs Python code on one thread at a time (the GIL). Left free to
move, its threads wake each other on whichever cores are idle, and every hand-off of
the GIL across cores costs CPU: measured on the 2-core benchmark machine, pinning the
API process cut its CPU per ``/v1/health`` by 18 % and per ``index.put`` by 29 %, and
the dev fleet's end-to-end runs/s rose 17 % (docs/benchmarks.md "Last sitting of issue 16").
The same was measured by Frappe for its gthread workers (frappe/frappe#28854).

Linux only (``os.sched_setaffinity``); elsewhere nothing is pinned.
"""
from __future__ import annotations

import os

__all__ = ["AffinityError", "choose_cpu", "pin_process"]


class AffinityError(ValueError):
    """The requested CPU is not a whole number or not one this process may run on."""


def choose_cpu(choice: str, allowed: set[int] | None = None) -> int | None:
    """The core ``choice`` names, or None for "do not pin".

    Args:
        choice: ``"auto"`` (the highest-numbered allowed core, when there are at least
            two), ``"all"`` (do not pin) or a core number such as ``"1"``.
        allowed: the cores this process may run on (default: ``os.sched_getaffinity(0)``).

    Returns the core number, or None (``"all"``, a single allowed core, or no
    ``sched_setaffinity`` on this platform). Raises AffinityError for anything else.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    text = choice.strip().lower()
    if text == "all":
        return None
    if text == "auto":
        return max(allowed) if len(allowed) > 1 else None
    if not text.isdigit():
        raise AffinityError(f"--cpu {choice!r}: expected auto, all or a core number")
    cpu = int(text)
    if cpu not in allowed:
        raise AffinityError(f"--cpu {cpu}: this process may run on cores {sorted(allowed)} only")
    return cpu


def pin_process(cpu: int) -> int:
    """Restrict every thread of this process, and every thread it starts later, to ``cpu``.

    Returns the number of threads pinned. Threads started afterwards inherit the
    mask of the thread that starts them, so pin before starting servers and pools.
    Raises OSError when the kernel refuses (e.g. a core outside the cgroup's cpuset); the
    threads pinned before the refusal get their old mask back first, so the process is either
    pinned whole or not at all.
    """
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    old = os.sched_getaffinity(0)
    pinned: list[int] = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {cpu})
        except ProcessLookupError:  # that thread has just ended
            continue
        except OSError:
            for done in pinned:
                try:
                    os.sched_setaffinity(done, old)
                except ProcessLookupError:
                    pass
            raise
        pinned.append(tid)
    return len(tids)
