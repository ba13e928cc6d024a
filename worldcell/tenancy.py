"""The tenant key every cell carries (docs/tenants.md "Isolation").

A tenant is an app the fleet serves (``worldcell.models.Tenant``). Its slug is
the first column of the unique key of every cell row — run cells, streams,
stream registrations, index entries, queue shards, tombstones and the other
per-run records — so the same run id, hook token, index key, stream name or
queue shard in two tenants are two different cells, and a lookup without the
tenant cannot name a row.

The tenant is decided once, at the entry (``worldcell.credentials.authenticate``
for an RPC, the operator's scope in the console), and handed to the cell
service explicitly: ``RunCell(name, tenant=…)``. Services default to the
default tenant (``WORLD_SECRET``'s), so a fleet that never creates a second
tenant, and every caller written before tenants, behaves exactly as before.
"""
from __future__ import annotations

from django.db import models

__all__ = ["DEFAULT_TENANT", "TENANT_MAX_CHARS", "tenant_key"]

#: The slug of the tenant ``WORLD_SECRET`` belongs to (``worldcell.models.Tenant.DEFAULT``).
DEFAULT_TENANT = "default"
#: ``Tenant.slug``'s length.
TENANT_MAX_CHARS = 63


def tenant_key(**extra) -> models.CharField:
    """The ``tenant`` column of a cell row: the owning tenant's slug, the default tenant's by default.

    A plain indexed-by-its-unique-keys text column rather than a foreign key:
    the slug is immutable and tenants are disabled, never deleted
    (``worldcell.models.Tenant``), so no join and no per-insert constraint
    check is needed on the hot paths; ``db_index`` is off because every
    unique key and index of the row leads with it.
    """
    return models.CharField(max_length=TENANT_MAX_CHARS, default=DEFAULT_TENANT, db_index=False,
                            help_text="owning tenant's slug (worldcell.models.Tenant)", **extra)
