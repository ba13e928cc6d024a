"""Who is calling: a bearer credential decides the tenant and the client protocol (docs/tenants.md).

One entry, ``authenticate(header)``, answers for every RPC:

* ``WORLD_SECRET`` (the environment) is a secret of the default tenant, exactly as before
  tenants existed: it is checked first and never needs the database;
* stored secrets (``TenantSecret``, always ``wcs_`` and 43 URL-safe characters) are kept only
  as keyed hashes, ``HMAC-SHA256(key, secret)``, with a key derived from ``DJANGO_SECRET_KEY``;
  each row records which key (``key_id``), and a secret hashed under one of
  ``SECRET_KEY_FALLBACKS`` is still accepted, so a key rotation does not lock apps out. A token
  of any other shape is refused without looking further.

Cost per RPC: one HMAC of the token and one dict lookup. Each process keeps a snapshot of the
live stored secrets. A request finding it older than ``REFRESH_S`` reloads it (one small
query; only one request at a time, the others go on with the snapshot they have), so it is
normally at most ``REFRESH_S`` old; a snapshot older than ``TRUST_S`` is not used. That is the
revocation bound: a revoked secret is refused on every API process within ``TRUST_S`` (1 s),
without a restart. When no trusted snapshot can be had (the database is down or slow), a
stored-secret caller waits at most ``WAIT_S`` and then gets 503 ``CredentialsUnavailable``
(retryable; never a 401 that looks like a revocation); ``WORLD_SECRET`` callers are not
affected. Expiry is checked on every call. The lookup is by digest, so how long it takes says
nothing about how much of a guessed secret is right.

``last_used_at`` is written by a short-lived thread of its own, one bulk UPDATE at most every
``TOUCH_S``, best effort: never on a request's path, and a failed write changes nothing else.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import re
import secrets as _secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from django.conf import settings
from django.db import DatabaseError, connection, transaction

log = logging.getLogger("worldcell.credentials")

_PREFIX = "Bearer "
#: a snapshot older than this is reloaded by the next request
REFRESH_S = 0.5
#: a snapshot older than this is not used (the revocation bound)
TRUST_S = 1.0
#: how long a stored-secret request waits for a trusted snapshot before 503 CredentialsUnavailable
WAIT_S = 0.5
#: after a failed reload, the next try waits this long
RETRY_S = 0.5
#: ``last_used_at`` is written at most this often
TOUCH_S = 60.0
#: a failed reload is logged at most this often
WARN_EVERY_S = 30.0
#: the longest a reload's query may run (PostgreSQL ``statement_timeout``)
QUERY_TIMEOUT_MS = 800
SECRET_PREFIX = "wcs_"
_STORED_SHAPE = re.compile(r"wcs_[A-Za-z0-9_-]{43}")


class CredentialsUnavailable(Exception):
    """No trusted snapshot of the stored secrets could be had (the database is down or slow)."""


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


# --------------------------------------------------------------------------- keys and digests


def _keys() -> tuple[bytes, ...]:
    """The hashing keys: derived from SECRET_KEY first, then from each of SECRET_KEY_FALLBACKS."""
    return _derive(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


@functools.lru_cache(maxsize=8)
def _derive(primary: str, fallbacks: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(hmac.new(k.encode(), b"worldcell tenant secret v1", hashlib.sha256).digest()
                 for k in (primary, *fallbacks))


def key_id(key: bytes) -> str:
    """A short public name of a hashing key (which key a stored secret was hashed under)."""
    return hmac.new(key, b"worldcell key id", hashlib.sha256).hexdigest()[:8]


def known_key_ids() -> tuple[str, ...]:
    """The ids of the current key and of each fallback, current first."""
    return tuple(key_id(k) for k in _keys())


def digest(token: str, key: bytes | None = None) -> str:
    """The stored form of ``token``: HMAC-SHA256 under the current (or the given) key, hex."""
    return hmac.new(key or _keys()[0], token.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


@functools.lru_cache(maxsize=8)
def _world_secret_digest(key: bytes, world_secret: str) -> str:
    return digest(world_secret, key)


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


# --------------------------------------------------------------------------- the snapshot


class _Snapshot:
    """This process's view of the live stored secrets, by digest."""

    def __init__(self) -> None:
        self.reloading = threading.Lock()
        self.changed = threading.Condition()
        self.loaded_at = float("-inf")  # monotonic time the loaded rows were read at
        self.failed_at = float("-inf")
        self.warned_at = float("-inf")
        self.by_digest: dict[str, _Live] = {}
        self.used: dict[int, float] = {}  # secret id -> last use (wall clock), not written yet
        self.used_lock = threading.Lock()
        self.touched_at = float("-inf")
        self.touching = False

    def age(self) -> float:
        return time.monotonic() - self.loaded_at

    def current(self) -> dict[str, _Live]:
        """The live secrets from a snapshot at most TRUST_S old; CredentialsUnavailable when there is none."""
        if self.age() >= REFRESH_S and time.monotonic() - self.failed_at >= RETRY_S:
            if self.reloading.acquire(blocking=False):
                try:
                    self._reload()
                finally:
                    self.reloading.release()
                    with self.changed:  # wake the waiters, whatever the reload's outcome
                        self.changed.notify_all()
        if self.age() < TRUST_S:
            return self.by_digest
        deadline = time.monotonic() + WAIT_S
        with self.changed:  # another request is reloading: wait for it, briefly (no one is: fail now)
            while self.age() >= TRUST_S and self.reloading.locked() and time.monotonic() < deadline:
                self.changed.wait(deadline - time.monotonic())
        if self.age() < TRUST_S:
            return self.by_digest
        raise CredentialsUnavailable("the stored tenant secrets cannot be read")

    def _reload(self) -> None:
        started = time.monotonic()
        try:
            with _bounded_query():
                rows = list(live_secrets(datetime.now(timezone.utc))
                            .values_list("id", "digest", "expires_at", "tenant__slug", "tenant__protocol"))
        except DatabaseError as exc:
            self.failed_at = time.monotonic()
            if self.failed_at - self.warned_at >= WARN_EVERY_S:
                self.warned_at = self.failed_at
                log.warning("tenant secrets could not be loaded (stored secrets answer 503 meanwhile): %s",
                            _first_line(exc))
            return
        fresh = {dig: _Live(sid, slug, protocol or default_protocol(), exp.timestamp() if exp else None)
                 for sid, dig, exp, slug, protocol in rows}
        with self.changed:
            self.by_digest, self.loaded_at = fresh, started
        self._maybe_touch()

    def note_use(self, secret_id: int) -> None:
        with self.used_lock:
            self.used[secret_id] = time.time()

    def _maybe_touch(self) -> None:
        """Write ``last_used_at`` from a thread of its own, at most every TOUCH_S, one statement."""
        with self.used_lock:
            if self.touching or not self.used or time.monotonic() - self.touched_at < TOUCH_S:
                return
            batch, self.used = self.used, {}
            self.touching, self.touched_at = True, time.monotonic()
        threading.Thread(target=self._touch, args=(batch,), name="credentials-touch", daemon=True).start()

    def _touch(self, batch: dict[int, float]) -> None:
        from .models import TenantSecret

        try:
            at = datetime.fromtimestamp(max(batch.values()), timezone.utc)
            with _bounded_query():
                TenantSecret.objects.filter(id__in=list(batch)).update(last_used_at=at)
        except Exception as exc:  # noqa: BLE001 - best effort: a lost last-use time changes nothing else
            log.info("last use of tenant secrets not recorded: %s", _first_line(exc))
        finally:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - this thread's connection, never used again
                pass
            with self.used_lock:
                self.touching = False

    def forget(self) -> None:
        """Drop the snapshot and the uses not written yet: the next call reloads (after this process
        itself changed a secret; an id may then name another row)."""
        with self.changed:
            self.loaded_at = self.failed_at = float("-inf")
        with self.used_lock:
            self.used, self.touched_at = {}, float("-inf")


@contextlib.contextmanager
def _bounded_query():
    """Statements that may run at most QUERY_TIMEOUT_MS on PostgreSQL (SQLite's reads never wait for a
    writer in WAL mode, so they run in autocommit there). Inside a caller's transaction (a test's)
    ``SET LOCAL`` would outlive these statements: no limit there."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {int(QUERY_TIMEOUT_MS)}")
        yield


def live_secrets(now: datetime):
    """The stored secrets that are accepted at ``now``: not revoked, not expired, tenant enabled,
    hashed under a key this process knows (the one rule, for the snapshot and ``manage.py tenant``)."""
    from .models import TenantSecret

    return (TenantSecret.objects.filter(revoked_at__isnull=True, tenant__disabled=False, key_id__in=known_key_ids())
            .exclude(expires_at__lte=now))


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


_snapshot = _Snapshot()
forget = _snapshot.forget


# --------------------------------------------------------------------------- the two questions of the RPC route


def configured() -> bool:
    """Whether any credential can be accepted: ``WORLD_SECRET``, or a live stored secret.

    Raises CredentialsUnavailable when that depends on stored secrets that cannot be read.
    """
    return bool(settings.WORLD_SECRET) or bool(_snapshot.current())


def authenticate(header: str | None) -> Identity | None:
    """The caller named by an ``Authorization`` header, or None when no live credential matches.

    Raises CredentialsUnavailable for a stored-secret token while the stored secrets cannot be read.
    """
    token = token_of(header)
    if token is None:
        return None
    keys = _keys()
    given = digest(token, keys[0])
    world_secret = settings.WORLD_SECRET
    if world_secret and hmac.compare_digest(given, _world_secret_digest(keys[0], world_secret)):
        return Identity(_DEFAULT, default_protocol())  # configuration: not subject to the tenant's flag
    if not _STORED_SHAPE.fullmatch(token):  # no stored secret has another shape
        return None
    live = _snapshot.current()
    found = live.get(given)
    if found is None and len(keys) > 1:  # hashed under a key that has since been rotated out
        found = next((live[d] for d in (digest(token, k) for k in keys[1:]) if d in live), None)
    if found is None or (found.expires_at_s is not None and time.time() >= found.expires_at_s):
        return None
    _snapshot.note_use(found.secret_id)
    return Identity(found.tenant, found.protocol, found.secret_id)


_DEFAULT = "default"  # worldcell.models.Tenant.DEFAULT (not imported here: this module loads before the apps)


# --------------------------------------------------------------------------- operators (manage.py tenant)


def add_secret(tenant_slug: str, label: str, expires_at: datetime | None = None):
    """Create a secret for ``tenant_slug``; returns ``(the secret in clear, its row)`` — the only time it is seen."""
    from .models import Tenant, TenantSecret

    tenant = Tenant.default() if tenant_slug == Tenant.DEFAULT else Tenant.objects.get(slug=tenant_slug)
    secret = new_secret()
    row = TenantSecret.objects.create(tenant=tenant, label=label, digest=digest(secret), key_id=known_key_ids()[0],
                                      hint=secret[:8], expires_at=expires_at)
    forget()
    return secret, row


def revoke_secret(secret_id: int) -> bool:
    """Revoke stored secret ``secret_id``; False when there is no such live secret."""
    from .models import TenantSecret

    done = TenantSecret.objects.filter(id=secret_id, revoked_at__isnull=True).update(
        revoked_at=datetime.now(timezone.utc))
    forget()
    return bool(done)
