"""``manage.py tenant``: the fleet's tenants and their bearer secrets (docs/tenants.md).

    manage.py tenant list
    manage.py tenant disable SLUG | enable SLUG
    manage.py tenant secret add --label LABEL [--tenant SLUG] [--expires 90d]
    manage.py tenant secret list [--tenant SLUG]
    manage.py tenant secret revoke ID

``secret add`` prints the new secret once; the fleet keeps only its keyed hash. Every API
process accepts it, and stops accepting a revoked or expired one, within a second. A rotation:
add a secret, give it to the app (``CELLD_WORLD_SECRET``) and roll the app, then revoke the old
one — both work meanwhile. ``WORLD_SECRET`` stays a secret of the default tenant for as long as
it is set (unset it to retire it).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from worldcell import credentials
from worldcell.durations import parse_duration_ms
from worldcell.models import Tenant, TenantSecret


LABEL_MAX = 100  # TenantSecret.label


def _when(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


class Command(BaseCommand):
    help = "List, disable and enable tenants; add, list and revoke their bearer secrets (docs/tenants.md)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="what", required=True, parser_class=type(parser))
        sub.add_parser("list", help="the tenants, their protocol and live secrets", called_from_command_line=True)
        for verb, text in (("disable", "refuse every stored secret of the tenant (within 1 s)"),
                           ("enable", "accept the tenant's live secrets again")):
            sub.add_parser(verb, help=text, called_from_command_line=True).add_argument("slug", help="tenant slug")
        secret = sub.add_parser("secret", help="a tenant's bearer secrets", called_from_command_line=True)
        action = secret.add_subparsers(dest="action", required=True, parser_class=type(parser))
        add = action.add_parser("add", help="create a secret and print it (once)", called_from_command_line=True)
        add.add_argument("--label", required=True, help="what the secret is for, e.g. 'prod app, 2026-12'")
        add.add_argument("--tenant", default=Tenant.DEFAULT, help="tenant slug (default: %(default)s)")
        add.add_argument("--expires", help="a duration after which it is refused, e.g. 90d, 12h")
        listing = action.add_parser("list", help="the tenant's secrets (never their values)",
                                    called_from_command_line=True)
        listing.add_argument("--tenant", default=Tenant.DEFAULT, help="tenant slug (default: %(default)s)")
        revoke = action.add_parser("revoke", help="refuse a secret from now on (within 1 s)",
                                   called_from_command_line=True)
        revoke.add_argument("id", type=int, help="the secret's id (secret list)")

    def handle(self, *args, what: str, action: str | None = None, **opts):
        if what == "list":
            return self._list_tenants()
        if what in ("disable", "enable"):
            return self._set_disabled(opts["slug"], what == "disable")
        if action == "add":
            return self._add(opts["tenant"], opts["label"], opts["expires"])
        if action == "list":
            return self._list_secrets(opts["tenant"])
        return self._revoke(opts["id"])

    def _tenant(self, slug: str) -> Tenant:
        if slug == Tenant.DEFAULT:
            return Tenant.default()
        try:
            return Tenant.objects.get(slug=slug)
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant {slug!r} (manage.py tenant list)") from None

    def _list_tenants(self) -> None:
        self.stdout.write(f"{'tenant':<20} {'protocol':<9} {'state':<9} live secrets")
        for t in Tenant.objects.order_by("slug"):
            live = credentials.live_secrets(datetime.now(timezone.utc)).filter(tenant=t).count()
            extra = " + WORLD_SECRET" if t.slug == Tenant.DEFAULT and _world_secret_set() else ""  # disabled or not
            protocol = t.protocol or f"{credentials.default_protocol()}*"
            self.stdout.write(f"{t.slug:<20} {protocol:<9} {'disabled' if t.disabled else 'enabled':<9} {live}{extra}")
        self.stdout.write("* from WORLDCELL_CLIENT_PROTOCOL")

    def _set_disabled(self, slug: str, disabled: bool) -> None:
        tenant = self._tenant(slug)
        Tenant.objects.filter(pk=tenant.pk).update(disabled=disabled)
        if disabled:
            self.stdout.write(f"tenant {tenant.slug} disabled: every API process refuses its stored secrets within "
                              "a second; its data is kept")
            if tenant.slug == Tenant.DEFAULT and _world_secret_set():
                self.stdout.write("WORLD_SECRET is configuration, not a stored secret: it is still accepted "
                                  "(unset it and restart the API to stop it)")
        else:
            self.stdout.write(f"tenant {tenant.slug} enabled: its live secrets are accepted again within a second")

    def _add(self, slug: str, label: str, expires: str | None) -> None:
        label = label.strip()
        if not 1 <= len(label) <= LABEL_MAX:
            raise CommandError(f"--label must be 1 to {LABEL_MAX} characters")
        try:
            label.encode("utf-8")
        except UnicodeEncodeError:
            raise CommandError("--label is not valid text (undecodable bytes)") from None
        tenant = self._tenant(slug)
        expires_at = None
        if expires:
            try:
                ms = parse_duration_ms(expires, "--expires")
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from None
            if ms is None or ms == 0:
                raise CommandError("--expires must be a positive duration, e.g. 90d")
            try:
                expires_at = datetime.now(timezone.utc) + timedelta(milliseconds=ms)
            except (OverflowError, ValueError):
                raise CommandError("--expires is too far in the future") from None
        secret, row = credentials.add_secret(tenant.slug, label, expires_at)
        self.stdout.write(f"secret {row.id} for tenant {tenant.slug} ({label!r}), expires {_when(expires_at)}:")
        self.stdout.write(f"  {secret}")
        self.stdout.write("It is shown only now: the fleet keeps a keyed hash. Give it to the app as "
                          "CELLD_WORLD_SECRET; every API process accepts it within a second.")

    def _list_secrets(self, slug: str) -> None:
        tenant = self._tenant(slug)
        self.stdout.write(f"{'id':>5}  {'label':<24} {'begins':<10} {'created':<21} {'last used':<21} "
                          f"{'expires':<21} state")
        now = datetime.now(timezone.utc)
        keys = credentials.known_key_ids()
        for s in TenantSecret.objects.filter(tenant=tenant).order_by("id"):
            state = ("revoked " + _when(s.revoked_at) if s.revoked_at else
                     "expired" if s.expires_at and s.expires_at <= now else
                     "refused: hashed under an unknown DJANGO_SECRET_KEY" if s.key_id not in keys else
                     "live (hashed under a DJANGO_SECRET_KEY_FALLBACKS key)" if s.key_id != keys[0] else
                     "tenant disabled" if tenant.disabled else "live")
            self.stdout.write(f"{s.id:>5}  {s.label[:24]:<24} {s.hint + '…':<10} {_when(s.created_at):<21} "
                              f"{_when(s.last_used_at):<21} {_when(s.expires_at):<21} {state}")
        if tenant.slug == Tenant.DEFAULT and _world_secret_set():
            self.stdout.write("    -  WORLD_SECRET (environment): live while it is set")

    def _revoke(self, secret_id: int) -> None:
        if not credentials.revoke_secret(secret_id):
            raise CommandError(f"no live secret {secret_id} (manage.py tenant secret list)")
        self.stdout.write(f"secret {secret_id} revoked: every API process refuses it within a second")


def _world_secret_set() -> bool:
    from django.conf import settings

    return bool(settings.WORLD_SECRET)
