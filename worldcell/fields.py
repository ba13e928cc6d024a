"""Model fields shared by the cells and the queue."""
from __future__ import annotations

from django.db import models

__all__ = ["BytewiseTextField"]


class BytewiseTextField(models.TextField):
    """Text that orders and compares by UTF-8 bytes (= Unicode code points, docs/protocol.md §1.3, §12 A3).

    PostgreSQL: the column gets ``COLLATE "C"``, so ``<``/``>``/``ORDER BY``
    and the btree built on it are bytewise. SQLite: the default BINARY
    collation already is. The collation is chosen per connection, so one
    migration serves both databases. (Migrations name it by the paths it was
    first defined at, ``cells.models.runs`` and ``queueing.models``, which
    re-export this class.)
    """

    def db_parameters(self, connection):
        params = super().db_parameters(connection)
        if connection.vendor == "postgresql":
            params["collation"] = "C"
        return params
