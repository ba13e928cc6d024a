"""The console's dead letters: the list and page, "Redrive", "Purge" and "Purge all…".

Dead letters with queue, pathname, queue name, attempts, last error, failed
at, body preview (the page and the columns it shares with the messages:
``queueing.admin_messages._StoredMessageAdmin``). Actions "Redrive" and
"Purge" on the selection (at most ``ACTION_MAX_ROWS``) and as buttons on a
dead letter's page, "Purge all…" behind a confirmation page; each reports
what it did and why anything was refused, and is recorded in the admin log.
They need ``queueing.redrive_deadletter`` / ``queueing.purge_deadletter``.
"Redrive to another URL…" is ``queueing.admin_redrive_url``.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from worldcell import clock
from worldcell.admin_site import (
    OperatorModelAdmin,
    distinct_values_filter,
    format_epoch_ms,
    query_string,
    row_pk_or_404,
)

from .admin_dashboard import _count
from .admin_messages import _attempts_fieldset, _error_cell, _StoredMessageAdmin
from .admin_redrive_url import RedriveEditedUrlMixin
from .models import DeadLetter, QueueCell
from .operations import purge_all_dead_letters, purge_selected_dead_letters, redrive_dead_letters

__all__ = ["ACTION_MAX_ROWS", "DeadLetterAdmin", "FailedAtFilter"]

#: Dead letters one redrive/purge request may touch.
ACTION_MAX_ROWS = 1000


class FailedAtFilter(admin.SimpleListFilter):
    """Dead letters by how long ago they failed (``failed_at`` is epoch ms)."""

    title = "failed"
    parameter_name = "failed"
    RANGES = {"1h": 3_600_000, "24h": 86_400_000, "7d": 604_800_000}

    def lookups(self, request, model_admin):
        return [("1h", "in the last hour"), ("24h", "in the last 24 hours"), ("7d", "in the last 7 days")]

    def queryset(self, request, queryset):
        span = self.RANGES.get(self.value() or "")
        return queryset.filter(failed_at__gte=clock.now_ms() - span) if span else queryset


# --------------------------------------------------------------------------- dead letters


class DeadLetterAdmin(RedriveEditedUrlMixin, _StoredMessageAdmin, OperatorModelAdmin):
    """Dead letters with "Redrive", "Purge" and "Purge all…" (see the module docstring)."""

    list_display = (
        "message_id", "cell", "pathname", "queue_name", "attempt", "last_error_short", "failed", "body_preview",
    )
    list_filter = ("cell", "pathname", distinct_values_filter("queue_name", "queue name"), FailedAtFilter)
    ordering = ("-failed_at", "-id")
    actions = ("redrive_selected", "purge_selected")
    change_list_template = "admin/queueing/deadletter/change_list.html"
    change_form_template = "admin/queueing/deadletter/change_form.html"
    fieldsets = (
        (None, {"fields": ("message_id", "cell", "dlq_key", "queue_name", "pathname", "target_base_url",
                           "idempotency_key", "run")}),
        ("Failure", {"fields": ("attempt", "deliveries", "last_status", "last_error", "enqueued", "failed")}),
        _attempts_fieldset(),
        ("Body", {"fields": ("body_display",)}),
    )
    readonly_fields = (
        "message_id", "cell", "dlq_key", "queue_name", "pathname", "target_base_url", "idempotency_key", "run",
        "attempt", "deliveries", "last_status", "last_error", "enqueued", "failed", "body_display", "attempt_log",
    )

    # ------------------------------------------------------------------ columns

    @admin.display(description="last error")
    def last_error_short(self, obj: DeadLetter) -> str:
        return _error_cell(obj.last_error)

    @admin.display(description="failed at", ordering="failed_at")
    def failed(self, obj: DeadLetter) -> str:
        return format_epoch_ms(obj.failed_at)

    # ------------------------------------------------------------------ permissions

    def has_redrive_permission(self, request) -> bool:
        """``queueing.redrive_deadletter`` (superusers have it)."""
        return request.user.is_active and request.user.has_perm("queueing.redrive_deadletter")

    def has_purge_permission(self, request) -> bool:
        """``queueing.purge_deadletter`` (superusers have it)."""
        return request.user.is_active and request.user.has_perm("queueing.purge_deadletter")

    # ------------------------------------------------------------------ actions

    def _selection(self, request, queryset) -> list[DeadLetter] | None:
        """The selected dead letters (cell joined), or None (with a message) when there are too many."""
        rows = list(queryset.select_related("cell").order_by("cell__name", "dlq_key")[: ACTION_MAX_ROWS + 1])
        if len(rows) > ACTION_MAX_ROWS:
            self.message_user(
                request,
                f"Refused: more than {ACTION_MAX_ROWS} dead letters selected. Narrow the list, or use "
                "“Purge all…”.",
                messages.ERROR,
            )
            return None
        return rows

    @admin.action(description="Redrive selected dead letters", permissions=["redrive"])
    def redrive_selected(self, request, queryset):
        """Each selected dead letter back to its queue (``redriveDeadLetter``); reports refusals."""
        rows = self._selection(request, queryset)
        if rows is not None:
            self._redrive(request, rows)

    def _redrive(self, request, rows: list[DeadLetter]) -> None:
        results = redrive_dead_letters(rows)
        for dead, result in zip(rows, results):
            text = (
                f"Redriven: message {result.message_id} is due again on {result.cell_name} (attempt 0)"
                if result.ok else f"Redrive refused: {result.reason}"
            )
            LogEntry.objects.log_actions(
                user_id=request.user.pk, queryset=[dead], action_flag=CHANGE, change_message=text, single_object=True
            )
        ok = [r for r in results if r.ok]
        refused = [r for r in results if not r.ok]
        if ok:
            self.message_user(
                request, f"Redrove {len(ok)} dead letter{'s' if len(ok) != 1 else ''}: due again now.", messages.SUCCESS
            )
        if refused:
            lines = "; ".join(f"{r.message_id} ({r.cell_name}): {r.reason}" for r in refused[:20])
            more = f" (and {len(refused) - 20} more)" if len(refused) > 20 else ""
            self.message_user(
                request,
                f"Could not redrive {len(refused)} dead letter{'s' if len(refused) != 1 else ''}: {lines}{more}",
                messages.WARNING if ok else messages.ERROR,
            )

    @admin.action(description="Purge selected dead letters", permissions=["purge"])
    def purge_selected(self, request, queryset):
        """Delete the selected dead letters, cell by cell, each in one locked transaction."""
        rows = self._selection(request, queryset)
        if rows is not None:
            self._purge(request, rows)

    def _purge(self, request, rows: list[DeadLetter]) -> None:
        by_cell: dict[str, list[DeadLetter]] = {}
        for dead in rows:
            by_cell.setdefault(dead.cell.name, []).append(dead)
        purged = 0
        for cell_name, dead in by_cell.items():
            n = purge_selected_dead_letters(cell_name, [d.dlq_key for d in dead])
            purged += n
            if n:
                remaining = set(DeadLetter.objects.filter(pk__in=[d.pk for d in dead]).values_list("pk", flat=True))
                LogEntry.objects.log_actions(
                    user_id=request.user.pk,
                    queryset=[d for d in dead if d.pk not in remaining],
                    action_flag=DELETION,
                    change_message=f"Purged from {cell_name}",
                )
        missing = len(rows) - purged
        if purged:
            self.message_user(request, f"Purged {purged} dead letter{'s' if purged != 1 else ''}.", messages.SUCCESS)
        if missing:
            self.message_user(
                request,
                f"{missing} selected dead letter{'s were' if missing != 1 else ' was'} already gone "
                "(redriven or purged meanwhile).",
                messages.WARNING if purged else messages.ERROR,
            )

    # ------------------------------------------------------------------ purge all, and per-row buttons

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("purge-all/", wrap(self.purge_all_view), name="%s_%s_purge_all" % info),
            path("<int:object_id>/redrive/", wrap(self.redrive_one_view), name="%s_%s_redrive" % info),
            path("<int:object_id>/purge/", wrap(self.purge_one_view), name="%s_%s_purge" % info),
            *self.redrive_url_urls(),  # queueing.admin_redrive_url
        ] + super().get_urls()

    def purge_all_view(self, request):
        """``purge-all/[?cell=<pk>]``: GET shows what would go, POST runs ``purgeDeadLetters`` per cell."""
        if not self.has_purge_permission(request):
            raise PermissionDenied
        cells = QueueCell.objects.annotate(n_dead=_count(DeadLetter.objects.filter(cell_id=OuterRef("pk"))))
        cell_pk = request.POST.get("cell") or request.GET.get("cell") or ""
        if cell_pk:
            cells = cells.filter(pk=int(cell_pk)) if cell_pk.isdigit() else cells.none()
        cells = [c for c in cells.order_by("name") if c.n_dead]
        changelist = reverse("admin:queueing_deadletter_changelist")
        if request.method == "POST" and request.POST.get("post") == "yes":
            purged = purge_all_dead_letters([c.name for c in cells])
            for cell in cells:
                LogEntry.objects.log_actions(
                    user_id=request.user.pk,
                    queryset=[cell],
                    action_flag=CHANGE,
                    change_message=f"Purged all dead letters: {purged.get(cell.name, 0)} deleted (purgeDeadLetters)",
                    single_object=True,
                )
            total = sum(purged.values())
            where = ", ".join(f"{name}: {n}" for name, n in purged.items()) or "no cell had any"
            self.message_user(
                request, f"Purged {total} dead letter{'s' if total != 1 else ''} ({where}).", messages.SUCCESS
            )
            return HttpResponseRedirect(changelist)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Purge all dead letters?",
            "subtitle": None,
            "cells": cells,
            "total": sum(c.n_dead for c in cells),
            "cell_pk": cell_pk,
            "changelist_url": changelist,
        }
        return TemplateResponse(request, "admin/queueing/deadletter/purge_all_confirmation.html", context)

    def _one(self, request, object_id) -> DeadLetter:
        if request.method != "POST":
            raise PermissionDenied("POST only")
        return get_object_or_404(DeadLetter.objects.select_related("cell"), pk=row_pk_or_404(object_id))

    def redrive_one_view(self, request, object_id: int):
        """POST ``<pk>/redrive/``: the dead letter page's "Redrive" button."""
        if not self.has_redrive_permission(request):
            raise PermissionDenied
        self._redrive(request, [self._one(request, object_id)])
        return HttpResponseRedirect(reverse("admin:queueing_deadletter_changelist"))

    def purge_one_view(self, request, object_id: int):
        """POST ``<pk>/purge/``: the dead letter page's "Purge" button."""
        if not self.has_purge_permission(request):
            raise PermissionDenied
        self._purge(request, [self._one(request, object_id)])
        return HttpResponseRedirect(reverse("admin:queueing_deadletter_changelist"))

    def changelist_view(self, request, extra_context=None):
        context = {"can_purge": self.has_purge_permission(request), **(extra_context or {})}
        cell = request.GET.get("cell__id__exact")
        context["purge_all_url"] = reverse("admin:queueing_deadletter_purge_all") + (
            query_string(cell=cell) if cell else ""
        )
        return super().changelist_view(request, context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context["can_redrive"] = self.has_redrive_permission(request)
            context["can_purge"] = self.has_purge_permission(request)
            context["can_redrive_url"] = self.has_redrive_edited_url_permission(request)
            context["title"] = f"Dead letter {obj.message_id}"
            context["subtitle"] = None
        return super().render_change_form(request, context, add, change, form_url, obj)
