"""Claim leases: short claim deadlines that the delivering process renews (docs/leases.md).

A claim (docs/protocol.md §7.4) used to last ``QUEUE_DELIVERY_TIMEOUT_MS +
30 000`` ms from the moment it was taken, so the messages a killed worker had
in flight waited five and a half minutes at default settings. Here a claim is
a *lease*:

* it is taken (and restarted when its POST begins) for
  ``QUEUE_CLAIM_LEASE_MS`` (default 10 000 ms) — ``first_deadline(now)``;
* while the POST runs, the process that makes it renews it every
  ``lease / 3`` (``LeaseRenewer``: one thread per pump, ONE statement for all
  of that process's live claims, compare-and-set on the claim token), to
  ``renewed_deadline(...)``: ``now + lease``, never past the cap
  ``delivery_started_at + QUEUE_DELIVERY_TIMEOUT_MS + 30 000`` (the old
  deadline, §7.2), never shorter than it is, and only while the lease is
  still live (a lapsed lease is lost: whoever fires the cell's alarm next
  recovers the message);
* the outcome is applied by the same compare-and-set on the claim token as
  before (``machine.apply_outcome``): a holder whose claim was recovered is
  refused it; a holder whose renewals failed but whose claim nobody
  recovered yet still applies it.

A lease longer than ``timeout + 30 000`` ms is cut to that, so setting
``QUEUE_CLAIM_LEASE_MS`` ≥ 330 000 restores the original deadline rule.

The renewal statement restates ``renewed_deadline`` in SQL;
``tests/queueing/test_queue_lease.py`` runs both on the same generated inputs.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

from django.db import DatabaseError, connection, connections

from worldcell import clock
from worldcell import sql as executor

from . import config
from .models import Message

log = logging.getLogger("queueing.lease")

__all__ = [
    "DEFAULT_CLAIM_LEASE_MS",
    "LeaseRenewer",
    "claim_lease_ms",
    "first_deadline",
    "lease_cap_ms",
    "renew_claims",
    "renewed_deadline",
]

#: Default ``QUEUE_CLAIM_LEASE_MS``: a dead holder's messages are due again within this.
DEFAULT_CLAIM_LEASE_MS = 10_000
#: Largest number of claims one renewal statement names (larger sets take several).
_RENEW_BATCH = 500


def claim_lease_ms() -> int:
    """``QUEUE_CLAIM_LEASE_MS`` (parseInt rules of docs/protocol.md §7.2), default 10 000 ms."""
    return config.positive_int_setting("QUEUE_CLAIM_LEASE_MS", DEFAULT_CLAIM_LEASE_MS)


def lease_cap_ms() -> int:
    """How long after its POST began a claim may live at most: delivery timeout + 30 000 ms (§7.2)."""
    return config.delivery_timeout_ms() + config.INFLIGHT_GRACE_MS


def first_deadline(now: int) -> int:
    """Deadline (epoch ms) of a claim taken, or whose POST begins, at ``now``: ``now + min(lease, cap)``."""
    return min(config.MAX_EPOCH_MS, max(0, now + min(claim_lease_ms(), lease_cap_ms())))


def renewed_deadline(now: int, started_at: int | None, current: int, lease_ms: int, cap_ms: int) -> int | None:
    """The deadline a renewal at ``now`` gives a claim, or None when it leaves the claim alone.

    Args (all epoch ms or ms): ``started_at`` — when the claim's POST began
    (``delivery_started_at``; None: not begun, not renewed); ``current`` —
    its deadline now; ``lease_ms`` / ``cap_ms`` — ``claim_lease_ms()`` /
    ``lease_cap_ms()``.

    Rules (docs/leases.md): a lapsed lease (``current ≤ now``) is lost and
    not renewed; the target is ``min(now + lease_ms, started_at + cap_ms)``;
    a renewal never shortens a deadline (target ≤ current -> None).
    """
    if started_at is None or current <= now:
        return None
    target = min(now + lease_ms, started_at + cap_ms)
    return target if target > current else None


# the SQL of renewed_deadline: the target, and the conditions under which it applies
_M = executor.table(Message)
_TARGET = 'CASE WHEN "delivery_started_at" + %s < %s THEN "delivery_started_at" + %s ELSE %s END'
_RENEW = (
    f'UPDATE "{_M}" SET "inflight_deadline" = {_TARGET} '
    f'WHERE ({{claims}}) AND "delivery_started_at" IS NOT NULL AND "inflight_deadline" > %s '
    f'AND "inflight_deadline" < {_TARGET} RETURNING "id"'
)
_ONE_CLAIM = '("id" = %s AND "claim_token" = %s)'


def renew_claims(claims: Iterable[tuple[int, str]], now: int | None = None) -> list[int]:
    """Renew the leases of ``claims`` (``(message_pk, claim_token)`` pairs) at ``now``; one statement per 500.

    Compare-and-set: a claim whose token changed (recovered, acked,
    re-claimed) or whose lease already lapsed is left alone. Returns the
    primary keys whose deadline moved. Database errors propagate (nothing was
    extended then: each statement is its own autocommit transaction).
    """
    pairs = list(claims)
    if not pairs:
        return []
    now = clock.now_ms() if now is None else now
    lease, cap = claim_lease_ms(), lease_cap_ms()
    target = [cap, now + lease, cap, now + lease]
    renewed: list[int] = []
    for i in range(0, len(pairs), _RENEW_BATCH):
        chunk = pairs[i : i + _RENEW_BATCH]
        sql = _RENEW.format(claims=" OR ".join([_ONE_CLAIM] * len(chunk)))
        params = [*target, *(v for pair in chunk for v in pair), now, *target]
        renewed += [row[0] for row in executor.rows(executor.database(), sql, params)]
    return renewed


class LeaseRenewer:
    """Renews the leases of the claims this process is delivering, every ``lease / 3``.

    ``hold(claim)`` when a claim's POST begins, ``release(claim)`` once its
    outcome was applied (or the delivery gave up). One daemon thread renews
    every held claim in one statement (``renew_claims``). A failed renewal
    (database unreachable) is logged and extends nothing; the next round
    tries again. Interface::

        leases = LeaseRenewer().start()
        leases.hold(claim); ...; leases.release(claim)
        leases.renew_now()   # one round in the calling thread -> pks renewed
        leases.stop()
    """

    def __init__(self, interval_s: float | None = None) -> None:
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], int] = {}  # (pk, token) -> holders (a claim is held once, normally)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0  # rounds that reached the database, for observers
        self.failures = 0  # rounds that failed

    def interval_s(self) -> float:
        """Seconds between rounds: ``lease / 3`` unless fixed at construction."""
        if self._interval_s is not None:
            return self._interval_s
        return max(0.05, claim_lease_ms() / 3000.0)

    def start(self) -> "LeaseRenewer":
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="queue-lease-renewer", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (held claims are no longer renewed: they lapse within one lease)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def hold(self, claim) -> None:
        """Start renewing ``claim`` (a ``machine.Claim``)."""
        key = (claim.message_pk, claim.token)
        with self._lock:
            self._held[key] = self._held.get(key, 0) + 1

    def release(self, claim) -> None:
        """Stop renewing ``claim``."""
        key = (claim.message_pk, claim.token)
        with self._lock:
            n = self._held.get(key, 0) - 1
            if n > 0:
                self._held[key] = n
            else:
                self._held.pop(key, None)

    def held(self) -> list[tuple[int, str]]:
        """The ``(message_pk, token)`` pairs held right now."""
        with self._lock:
            return list(self._held)

    def renew_now(self, now: int | None = None) -> list[int]:
        """One renewal round in the calling thread; the pks renewed. Raises on database errors."""
        held = self.held()
        if not held:
            return []
        renewed = renew_claims(held, now)
        self.renewals += 1
        return renewed

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.wait(self.interval_s())
                if self._stopping.is_set():
                    break
                try:
                    self.renew_now()
                except Exception as exc:  # noqa: BLE001 - nothing was extended; the next round retries
                    self.failures += 1
                    log.warning("queue leases: renewal of %d claim(s) failed: %s", len(self.held()), exc)
                    if isinstance(exc, DatabaseError):
                        connection.close()
                if not self.held():
                    connection.close()  # hold no database connection while idle
        finally:
            connections.close_all()
