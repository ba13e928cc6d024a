"""Shared plumbing of the operator console (the Django admin of ``cells`` and ``queueing``).

* ``ConsoleSite`` — the console's ``AdminSite``: its titles, full-width
  pages and a "View site" link to the console index. It is ``admin.site``
  through Django's documented hook: ``ConsoleAdminConfig.default_site``
  (``worldcell.apps``) replaces ``django.contrib.admin`` in
  ``INSTALLED_APPS``, so ``admin.site.register`` and ``admin.site.urls``
  need nothing else.
* ``OperatorModelAdmin`` — the base of every console page: read-only rows
  (event-sourced and machine-owned state is never edited by hand), visible
  to every active staff user, with a count-capped paginator and no facets,
  so list pages stay fast on tables with millions of rows.
* ``CappedCountPaginator`` — counts at most ``count_cap + 1`` rows instead of
  a full-table ``COUNT(*)``.
* ``distinct_values_filter`` — a list filter whose choices come from a
  loose index scan (a recursive CTE that jumps from one distinct value to
  the next through the column's index): O(values × log rows), not a scan.
* small formatters: ``status_badge``, ``format_epoch_ms``,
  ``format_datetime``, ``format_duration_ms``.

Actions (cancel, redrive, purge) need explicit permissions, checked by the
admins that define them; a superuser has them all.
"""
from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.http import Http404
from django.db import connection
from django.urls import reverse
from django.utils.html import format_html

from . import clock, codec

__all__ = [
    "CappedCountPaginator",
    "ConsoleSite",
    "OperatorModelAdmin",
    "distinct_values_filter",
    "format_datetime",
    "format_duration_ms",
    "format_epoch_ms",
    "row_pk",
    "row_pk_or_404",
    "status_badge",
]

#: The largest primary key a row can have (a signed 64-bit column on PostgreSQL and SQLite).
MAX_ROW_PK = 2**63 - 1


def row_pk(object_id: Any) -> int | None:
    """``object_id`` (a URL part) as a row's primary key, or None when no row can have it.

    Not an integer, < 1 or > 2^63 - 1 -> None, so that a page asked for such a row answers
    404 instead of passing the number to the database driver (which raises OverflowError).
    """
    try:
        pk = int(object_id)
    except (TypeError, ValueError):
        return None
    return pk if 1 <= pk <= MAX_ROW_PK else None


def row_pk_or_404(object_id: Any) -> int:
    """``row_pk(object_id)``; raises ``Http404`` when it is None."""
    pk = row_pk(object_id)
    if pk is None:
        raise Http404("no such row")
    return pk


class ConsoleSite(admin.AdminSite):
    """The operator console's admin site (``admin.site``, via ``ConsoleAdminConfig.default_site``)."""

    site_header = "worldcell operator console"
    site_title = "worldcell"
    index_title = "Runs, queues and dead letters"
    # The run and queue tables are wide (long ids, times, payload previews): give them the whole width.
    enable_nav_sidebar = False

    def each_context(self, request):
        """The admin's template context, with "View site" pointing at the console index.

        The fleet has no public site: ``/`` answers the JSON 404 of the RPC
        router, so the link leads to this site's index (under any mount prefix).
        """
        context = super().each_context(request)
        context["site_url"] = reverse(f"{self.name}:index", current_app=self.name)
        return context


class CappedCountPaginator(Paginator):
    """A paginator that never counts past ``count_cap`` rows.

    ``count`` runs ``SELECT COUNT(*) FROM (SELECT … LIMIT count_cap + 1)``:
    an exact number up to the cap, else ``count_cap`` with ``capped`` set
    (the pagination template then says "10,000+"). Pages beyond the cap are
    out of reach; operators narrow the list with filters or search instead.
    """

    count_cap = 10_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list.order_by()
        if hasattr(rows, "values"):  # count keys only: no annotated column is computed for the count
            rows = rows.values("pk")
        counted = rows[: self.count_cap + 1].count()
        self.capped = counted > self.count_cap
        return min(counted, self.count_cap)

    capped = False


class OperatorModelAdmin(admin.ModelAdmin):
    """Read-only console page for any active staff user.

    No add, change or delete (Django's "delete selected" action disappears
    with the delete permission); actions defined by subclasses declare their
    own permissions. Lists use ``CappedCountPaginator``, never show the
    unfiltered total, never compute facets.
    """

    paginator = CappedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    list_max_show_all = 500

    def changelist_view(self, request, extra_context=None):
        """The list, titled with the model's plural name (not "Select run to view")."""
        context = {"title": str(self.opts.verbose_name_plural).capitalize(), **(extra_context or {})}
        return super().changelist_view(request, context)

    def has_view_permission(self, request, obj=None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff)

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _distinct_values(model, column: str, limit: int) -> list[str]:
    """Up to ``limit`` distinct non-NULL values of ``column``, ascending, by loose index scan."""
    qn = connection.ops.quote_name
    table, col = qn(model._meta.db_table), qn(column)
    sql = (
        f"WITH RECURSIVE vals(v, n) AS ("
        f" SELECT (SELECT MIN({col}) FROM {table}), 1"
        f" UNION ALL"
        f" SELECT (SELECT MIN({col}) FROM {table} WHERE {col} > vals.v), vals.n + 1"
        f" FROM vals WHERE vals.v IS NOT NULL AND vals.n < %s"
        f") SELECT v FROM vals WHERE v IS NOT NULL"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [limit])
        return [row[0] for row in cur.fetchall()]


def distinct_values_filter(field: str, title: str, *, column: str | None = None, limit: int = 50):
    """A ``SimpleListFilter`` class over the distinct values of ``field`` (exact match).

    The choices are the first ``limit`` values in column order, found by a
    loose index scan (the column needs an index to be fast). A value given
    in the URL (``?<field>=…``) filters even when it is not among them.
    """

    class DistinctValuesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request, model_admin):
            values = _distinct_values(model_admin.model, column or field, limit)
            current = self.value()
            if current and current not in values:
                values.append(current)
            return [(v, v if len(v) <= 60 else v[:59] + "…") for v in values]

        def queryset(self, request, queryset):
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    DistinctValuesFilter.title = title
    DistinctValuesFilter.__name__ = f"{field.title().replace('_', '')}Filter"
    return DistinctValuesFilter


# --------------------------------------------------------------------------- formatters

#: Badge colour class per status (runs, steps, queue message states).
_BADGES = {
    "pending": "wc-badge-pending",
    "running": "wc-badge-running",
    "completed": "wc-badge-completed",
    "failed": "wc-badge-failed",
    "cancelled": "wc-badge-cancelled",
    "in flight": "wc-badge-running",
    "idle": "wc-badge-pending",
    "dead": "wc-badge-failed",
    "open": "wc-badge-running",
    "closed": "wc-badge-pending",
}


def status_badge(status: str | None) -> str:
    """A coloured pill for a run/step/message status (safe HTML)."""
    if not status:
        return "—"
    return format_html('<span class="wc-badge {}">{}</span>', _BADGES.get(status, "wc-badge-pending"), status)


def format_duration_ms(ms: int | float | None) -> str:
    """``ms`` milliseconds for humans: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``, ``3 d 4 h``."""
    if ms is None:
        return "—"
    ms = int(ms)
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms} ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f} s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m} min {s:02d} s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{sign}{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{sign}{d} d {h} h"


def _relative(delta_ms: int) -> str:
    if abs(delta_ms) < 1000:
        return "now"
    text = format_duration_ms(abs(delta_ms))
    return f"in {text}" if delta_ms > 0 else f"{text} ago"


def format_datetime(
    value: datetime | None, *, now_ms: int | None = None, relative: bool = False, same_day_as: datetime | None = None
) -> str:
    """A datetime as ``2026-01-02 03:04:05.678 UTC`` (ISO in the tooltip), optionally with "(3 s ago)".

    ``same_day_as``: when ``value`` falls on that UTC date, only the time of
    day is shown (``03:04:05.678``) — for tables of one run's steps and events.
    """
    if value is None:
        return "—"
    iso = codec.format_iso(value)
    text = iso.replace("T", " ").rstrip("Z")
    if same_day_as is not None and codec.format_iso(same_day_as)[:10] == iso[:10]:
        text = text[11:]
    text += " UTC"
    if not relative:
        return format_html('<span class="wc-time" title="{}">{}</span>', iso, text)
    now_ms = clock.now_ms() if now_ms is None else now_ms
    rel = _relative(codec.epoch_ms(value) - now_ms)
    return format_html('<span class="wc-time" title="{}">{}</span> <span class="wc-rel">({})</span>', iso, text, rel)


def format_epoch_ms(ms: int | None, *, now_ms: int | None = None, relative: bool = True, late_after_ms: int | None = None) -> str:
    """Epoch milliseconds as a UTC time (labelled "UTC") plus "(in 3 s)" / "(5 min ago)".

    ``late_after_ms``: when the time is more than this many ms in the past,
    the relative part is flagged (red) — for alarms and deadlines that
    should have fired already.
    """
    if ms is None:
        return "—"
    try:
        value = codec.from_epoch_ms(ms)
    except (ValueError, OverflowError):
        return str(ms)
    if not relative:
        return format_datetime(value)
    now_ms = clock.now_ms() if now_ms is None else now_ms
    delta = ms - now_ms
    iso = codec.format_iso(value)
    css = "wc-rel wc-late" if late_after_ms is not None and -delta > late_after_ms else "wc-rel"
    return format_html(
        '<span class="wc-time" title="{} ({} ms)">{} UTC</span> <span class="{}">({})</span>',
        iso, ms, iso.replace("T", " ").rstrip("Z"), css, _relative(delta),
    )


def query_string(**params: Any) -> str:
    """``?a=1&b=2`` for admin links (values URL-encoded; None values dropped)."""
    from urllib.parse import urlencode

    items = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(items) if items else ""
