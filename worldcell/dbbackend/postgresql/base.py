"""Django's PostgreSQL backend with a health check that costs no round trip (docs/benchmarks.md "Micro").

``ENGINE = "worldcell.dbbackend.postgresql"`` (set by ``worldcell.settings`` for every
``postgres://`` ``DATABASE_URL``). Everything is Django's ``django.db.backends.postgresql``
except ``is_usable``, which ``CONN_HEALTH_CHECKS`` calls before the first query of each
request on a kept connection. Django's own check sends ``SELECT 1``: one more round trip and
one more (read-only) transaction in PostgreSQL per RPC — 2.0 commits per ``index.put`` or
``applyEvent`` instead of 1, and 8–20 % of their server CPU (API + PostgreSQL).

Here an *idle* connection (no transaction open) is usable when its socket has nothing to
read: PostgreSQL sends nothing unasked on an idle session of ours (no ``LISTEN``), so data —
or end-of-file — waiting there means the server has closed it (restart, ``pg_terminate_backend``,
``idle_session_timeout``: it sends a FATAL error, then closes). Only then is ``SELECT 1`` sent,
and its answer decides, as in Django. A peer that vanished without closing (a cut network)
is not seen by the poll; the request's first statement then fails with ``OperationalError``
(HTTP 500, nothing written) and Django reconnects on the next request, as it does after any
error — where ``SELECT 1`` would have failed the same way, only one statement earlier.
"""
from __future__ import annotations

import select

from django.db.backends.postgresql import base

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE


class DatabaseWrapper(base.DatabaseWrapper):
    """``django.db.backends.postgresql``'s wrapper; only ``is_usable`` differs (module docstring)."""

    def is_usable(self) -> bool:
        """Whether the kept connection can serve the next request (no round trip when idle and quiet).

        Returns False for a missing, closed or broken connection; True for an idle one whose
        socket has nothing to read; otherwise Django's ``SELECT 1`` answers.
        """
        pg = self.connection
        if pg is None or pg.closed or pg.broken:
            return False
        if pg.info.transaction_status == _IDLE:
            try:
                poller = select.poll()
                poller.register(pg.fileno(), select.POLLIN | select.POLLPRI)
                if not poller.poll(0):
                    return True
            except (OSError, ValueError):
                return False
        return super().is_usable()
