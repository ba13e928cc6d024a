"""The startup check's "is there a live stored secret?" (plain DB-API SQL in ``worldcell.startup``,
run before the apps load) restates ``credentials.live_secrets`` (the ORM rule the snapshot and
``manage.py tenant`` use). A property test runs both on the same generated secrets, on both
databases (docs/architecture.md "Each rule of a machine is written once").
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings, strategies as st

from worldcell import credentials, startup
from worldcell.models import Tenant, TenantSecret

pytestmark = pytest.mark.django_db

# Each generated secret: (tenant index, revoked, expiry in days from now or None, key known).
SECRETS = st.lists(
    st.tuples(st.integers(0, 2), st.booleans(), st.one_of(st.none(), st.sampled_from([-30, -1, 1, 30])),
              st.booleans()),
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secrets=SECRETS, disabled=st.lists(st.booleans(), min_size=3, max_size=3))
def test_the_startup_sql_and_the_orm_rule_agree(secrets, disabled):
    TenantSecret.objects.all().delete()
    Tenant.objects.exclude(slug=Tenant.DEFAULT).delete()
    tenants = [Tenant.default(), *(Tenant.objects.create(slug=f"t{i}") for i in (1, 2))]
    for tenant, off in zip(tenants, disabled):
        Tenant.objects.filter(pk=tenant.pk).update(disabled=off)
    now = datetime.now(timezone.utc)
    known = credentials.known_key_ids()[0]
    for n, (which, revoked, days, key_known) in enumerate(secrets):
        TenantSecret.objects.create(
            tenant=tenants[which], label=f"s{n}", digest=f"{n:064x}", hint="wcs_", key_id=known if key_known else "zz",
            revoked_at=now if revoked else None,
            expires_at=None if days is None else now + timedelta(days=days),
        )
    expected = credentials.live_secrets(datetime.now(timezone.utc)).exists()
    assert startup._has_stored_secret(connection) is expected
