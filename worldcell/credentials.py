"""Who is calling: a bearer credential decides the tenant and the client protocol (docs/tenants.md).

One entry, ``authenticate(header)``, answers for every RPC:

* ``WORLD_SECRET`` (the environment) is a secret of the default tenant, exactly as before
  tenants existed;
* stored secrets (``TenantSecret``) are kept only as keyed hashes:
  ``HMAC-SHA256(key, secret)`` with a key derived from ``DJANGO_SECRET_KEY`` (its
  ``SECRET_KEY_FALLBACKS`` are still accepted, so a key rotation does not lock apps out);
* the answer is an ``Identity`` (tenant slug, client protocol) or None (401).

Cost per RPC: one HMAC of the token and one dict lookup. Each process keeps a snapshot of the
live stored secrets and reloads it when it is older than ``REFRESH_S`` (one small query at
most once a second per process), so a revoked secret is refused within a second on every
API process without a restart; an expiry is checked on every call against the snapshot's
``expires_at``. The lookup is by digest, so the time it takes does not depend on how much of
a guessed secret is right. ``last_used_at`` is written at most once per ``TOUCH_S`` per secret,
at a reload, never on the request path.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets as _secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.conf import settings
from django.db import DatabaseError

log = logging.getLogger("worldcell.credentials")

_PREFIX = "Bearer "
#: a snapshot of the stored secrets is reused this long (the revocation bound)
REFRESH_S = 1.0
#: ``last_used_at`` is written at most this often per secret
TOUCH_S = 60.0
#: the protocols a tenant may speak (docs/protocol.md); the default tenant's comes from WORLDCELL_CLIENT_PROTOCOL
PROTOCOLS = ("0.1",)
SECRET_PREFIX = "wcs_"


@dataclass(frozen=True)
class Identity:
    """The caller a credential names."""

    tenant: str
    protocol: str
    secret_id: int | None = None  # None: WORLD_SECRET


@dataclass(frozen=True)
class _Live:
    secret_id: int
    tenant: str
    protocol: str
    expires_at_s: float | None


def _keys() -> tuple[bytes, ...]:
    """The hashing keys: derived from SECRET_KEY first, then from each of SECRET_KEY_FALLBACKS."""
    return _derive(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


@functools.lru_cache(maxsize=8)
def _derive(primary: str, fallbacks: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(hmac.new(k.encode(), b"worldcell tenant secret v1", hashlib.sha256).digest()
                 for k in (primary, *fallbacks))


@functools.lru_cache(maxsize=8)
def _world_secret_digest(key: bytes, world_secret: str) -> str:
    return digest(world_secret, key)


def digest(token: str, key: bytes | None = None) -> str:
    """The stored form of ``token``: HMAC-SHA256 under the primary (or the given) key, hex."""
    return hmac.new(key or _keys()[0], token.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def new_secret() -> str:
    """A fresh secret: ``wcs_`` and 43 URL-safe characters (256 random bits)."""
    return SECRET_PREFIX + _secrets.token_urlsafe(32)


def default_protocol() -> str:
    return settings.WORLDCELL_CLIENT_PROTOCOL


def token_of(header: str | None) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (the scheme is case-sensitive, one space), or None."""
    if header is None:
        return None
    header = header.strip(" \t")
    if not header.startswith(_PREFIX):
        return None
    return header[len(_PREFIX):] or None


class _Snapshot:
    """The live stored secrets of this process, by digest; reloaded when older than REFRESH_S."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded_at = float("-inf")
        self.by_digest: dict[str, _Live] = {}
        self.used: dict[int, float] = {}  # secret id -> last use (monotonic), not yet written
        self.touched: dict[int, float] = {}  # secret id -> last write of last_used_at (monotonic)

    def current(self) -> dict[str, _Live]:
        if time.monotonic() - self.loaded_at >= REFRESH_S:
            with self.lock:
                if time.monotonic() - self.loaded_at >= REFRESH_S:
                    self._reload()
        return self.by_digest

    def _reload(self) -> None:
        from .models import TenantSecret

        now = datetime.now(timezone.utc)
        try:
            self._touch(now)
            rows = (TenantSecret.objects.filter(revoked_at__isnull=True, tenant__disabled=False)
                    .exclude(expires_at__lte=now)
                    .values_list("id", "digest", "expires_at", "tenant__slug", "tenant__protocol"))
            fresh = {}
            for secret_id, dig, expires_at, slug, protocol in rows:
                fresh[dig] = _Live(secret_id, slug, protocol or default_protocol(),
                                   expires_at.timestamp() if expires_at else None)
        except DatabaseError as exc:
            # fail closed for stored secrets (WORLD_SECRET still works); try again at the next call
            log.warning("tenant secrets could not be loaded: %s", str(exc).splitlines()[0][:200])
            self.by_digest, self.loaded_at = {}, float("-inf")
            return
        self.by_digest, self.loaded_at = fresh, time.monotonic()

    def _touch(self, now: datetime) -> None:
        from .models import TenantSecret

        mono = time.monotonic()
        due = [sid for sid, at in self.used.items() if mono - self.touched.get(sid, float("-inf")) >= TOUCH_S]
        if not due:
            return
        for sid in due:
            used_ago = mono - self.used.pop(sid)
            self.touched[sid] = mono
            TenantSecret.objects.filter(id=sid).update(last_used_at=now - timedelta(seconds=used_ago))

    def note_use(self, secret_id: int) -> None:
        self.used[secret_id] = time.monotonic()

    def forget(self) -> None:
        """Drop the snapshot (the next call reloads) and the write times of ``last_used_at``:
        after this process itself changed a secret (an id may then name another row)."""
        with self.lock:
            self.loaded_at = float("-inf")
            self.touched.clear()


_snapshot = _Snapshot()
forget = _snapshot.forget


def configured() -> bool:
    """Whether any credential can be accepted: ``WORLD_SECRET`` or a live stored secret."""
    return bool(settings.WORLD_SECRET) or bool(_snapshot.current())


def authenticate(header: str | None) -> Identity | None:
    """The caller named by an ``Authorization`` header, or None when no live credential matches."""
    token = token_of(header)
    if token is None:
        return None
    keys = _keys()
    given = digest(token, keys[0])
    world_secret = settings.WORLD_SECRET
    if world_secret and hmac.compare_digest(given, _world_secret_digest(keys[0], world_secret)):
        return Identity(_default_slug(), default_protocol())
    live = _snapshot.current()
    found = live.get(given)
    if found is None and len(keys) > 1:  # stored under a key that has since been rotated out
        found = next((live[d] for d in (digest(token, k) for k in keys[1:]) if d in live), None)
    if found is None:
        return None
    if found.expires_at_s is not None and time.time() >= found.expires_at_s:
        return None
    _snapshot.note_use(found.secret_id)
    return Identity(found.tenant, found.protocol, found.secret_id)


def _default_slug() -> str:
    from .models import Tenant

    return Tenant.DEFAULT


# --------------------------------------------------------------------------- operators (manage.py tenant)


def add_secret(tenant_slug: str, label: str, expires_at: datetime | None = None) -> tuple[str, "object"]:
    """Create a secret for ``tenant_slug``; returns ``(the secret in clear, its row)`` — the only time it is seen."""
    from .models import Tenant, TenantSecret

    tenant = Tenant.default() if tenant_slug == Tenant.DEFAULT else Tenant.objects.get(slug=tenant_slug)
    secret = new_secret()
    row = TenantSecret.objects.create(tenant=tenant, label=label, digest=digest(secret), hint=secret[:8],
                                      expires_at=expires_at)
    forget()
    return secret, row


def revoke_secret(secret_id: int) -> bool:
    """Revoke stored secret ``secret_id``; False when there is no such live secret."""
    from .models import TenantSecret

    done = TenantSecret.objects.filter(id=secret_id, revoked_at__isnull=True).update(
        revoked_at=datetime.now(timezone.utc))
    forget()
    return bool(done)
