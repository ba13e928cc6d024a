"""Fixtures of the operator-console tests (``tests/admin/``): ``make_operator``; the queue pages
reuse ``vclock``, ``sink`` and ``no_broker`` from ``tests/queueing/support.py``."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from tests.queueing.support import no_broker, sink, vclock  # noqa: F401  (fixtures)


@pytest.fixture
def make_operator(db):
    """``make_operator("cells.cancel_run", ...)`` -> a logged-in ``Client`` of a staff user with those perms."""
    counter = {"n": 0}

    def make(*perms: str, superuser: bool = False) -> Client:
        counter["n"] += 1
        user = User.objects.create_user(
            f"operator{counter['n']}", password="pw-operator", is_staff=True, is_superuser=superuser
        )
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        client = Client()
        client.force_login(user)
        client.user = user
        return client

    return make
