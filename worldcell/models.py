"""Operational state of the fleet itself (docs/operations.md "Health").

``Heartbeat`` keeps one row per periodic process: ``beat`` is touched by the
``fire_due_alarms`` task that Celery beat sends every second, so readiness
can tell that beat *and* a worker are running.
"""
from __future__ import annotations

from django.db import models

__all__ = ["Heartbeat", "Tenant", "TenantSecret"]


class Heartbeat(models.Model):
    """The last time (epoch ms) process ``name`` reported it was alive."""

    name = models.CharField(max_length=64, primary_key=True)
    at_ms = models.BigIntegerField(help_text="epoch ms of the last tick")

    class Meta:
        verbose_name = "heartbeat"

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    """An app (or a deployment of one) that the fleet serves: who a credential belongs to.

    Attributes:
        slug: the tenant's name in commands, metrics and the console; ``default`` is the
            tenant ``WORLD_SECRET`` belongs to, created by the migration.
        name: a display name.
        protocol: the world-celld client release the tenant's app speaks (``0.1``); empty for
            the default tenant = ``WORLDCELL_CLIENT_PROTOCOL``.
        disabled: every stored secret of a disabled tenant is refused (401) within a second.
            ``WORLD_SECRET`` is configuration, not a stored secret: a disabled default tenant
            still accepts it (unset it to stop it).
    """

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200, blank=True)
    protocol = models.CharField(max_length=8, blank=True, help_text="client protocol; empty: WORLDCELL_CLIENT_PROTOCOL")
    disabled = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    DEFAULT = "default"

    class Meta:
        verbose_name = "tenant"

    @classmethod
    def default(cls) -> "Tenant":
        """The default tenant (``WORLD_SECRET``'s); made again if someone deleted its row."""
        return cls.objects.get_or_create(slug=cls.DEFAULT, defaults={"name": cls.DEFAULT})[0]

    def __str__(self) -> str:
        return self.slug


class TenantSecret(models.Model):
    """One bearer secret of a tenant, stored only as a keyed hash (``worldcell.credentials``).

    A rotation is: add a secret, roll the app onto it, revoke the old one; both
    are accepted meanwhile. ``expires_at`` (optional) and ``revoked_at`` end it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="secrets")
    label = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True, help_text="HMAC-SHA256 of the secret (hex)")
    key_id = models.CharField(max_length=8, help_text="which hashing key (worldcell.credentials.key_id)")
    hint = models.CharField(max_length=12, help_text="the secret's first characters, to tell secrets apart")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "tenant secret"

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.label}"
