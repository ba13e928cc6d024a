"""The operator console for queues: a dashboard per queue cell, messages, dead letters (redrive, purge).

* **Queue cells** — the list is the dashboard of every shard (pending, in
  flight, dead letters, next alarm, age of the oldest due message, with
  links into the messages); a cell's page adds the messages due next, the
  claims in flight and the latest dead letters. Counts come from the queue
  service's own ``stats`` (``QueueCell(name).stats()``).
* **Messages** — live messages with attempts, deliveries, last error and
  status, due time, claim deadline and a body preview; read-only.
* **Dead letters** — with queue, pathname, queue name, attempts, last
  error, failed at, body preview. Actions "Redrive" and "Purge" on the
  selection, "Purge all…" behind a confirmation page; each reports what it
  did and why anything was refused, and is recorded in the admin log.
  They need ``queueing.redrive_deadletter`` / ``queueing.purge_deadletter``.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from worldcell import clock, display
from worldcell.admin_site import (
    OperatorModelAdmin,
    distinct_values_filter,
    format_duration_ms,
    format_epoch_ms,
    query_string,
    row_pk,
    row_pk_or_404,
    status_badge,
)

from . import config, console
from .admin_redrive_url import RedriveEditedUrlMixin
from .models import DeadLetter, Message, QueueCell
from .operations import purge_all_dead_letters, purge_selected_dead_letters, redrive_dead_letters
from .service import QueueCell as QueueCellService

#: Dead letters one redrive/purge request may touch.
ACTION_MAX_ROWS = 1000
#: Visible characters of a body preview in a list.
LIST_PREVIEW_CHARS = 120
#: Rows of each list on a queue cell's page.
CELL_PAGE_ROWS = 20
#: An alarm or due message this late (ms) means no driver is firing the cell: shown in red.
ALARM_LATE_MS = 5_000


def _count(qs) -> Coalesce:
    """``COUNT(*)`` of ``qs`` per cell as a correlated subquery (0 when none)."""
    return Coalesce(Subquery(qs.order_by().values("cell_id").annotate(n=Count("*")).values("n")), Value(0))


def _run_link(stored: display.StoredText | None) -> str:
    """A link to the run a queue body concerns (``runId`` / ``workflowRunId``), or ""."""
    run_id = display.queue_body_run_id(stored)
    if not run_id:
        return ""
    return format_html('<a href="{}" class="wc-mono">{}</a>', reverse("admin:cells_run_by_id", args=[run_id]), run_id)


def _error_cell(text: str | None) -> str:
    """A last-error column: the first 80 characters, all of it in the tooltip."""
    if not text:
        return ""
    return format_html(
        '<span class="wc-error" title="{}">{}</span>', text[:2000], text if len(text) <= 80 else text[:79] + "…"
    )


def _exact_search(queryset, search_term: str):
    """Exact match on message id, idempotency key or queue name (messages and dead letters)."""
    term = search_term.strip()
    if not term:
        return queryset, False
    if "\x00" in term:
        return queryset.none(), False
    return queryset.filter(Q(message_id=term) | Q(idempotency_key=term) | Q(queue_name=term)), False


def _oldest_due(first_due: int | None, now: int) -> str:
    """How long the earliest scheduled message has been due ("due 3 s ago"), or when it will be."""
    if first_due is None:
        return "none"
    if first_due <= now:
        late = now - first_due
        css = "wc-late" if late > ALARM_LATE_MS else ""
        return format_html('<span class="{}">due {} ago</span>', css, format_duration_ms(late))
    return format_html('<span class="wc-rel">next due in {}</span>', format_duration_ms(first_due - now))


def _lifecycle_context() -> dict[str, Any]:
    """Retention settings and last sweep (docs/lifecycle.md §8)."""
    from cells.admin_lifecycle import dashboard_context

    return dashboard_context()


class StateFilter(admin.SimpleListFilter):
    """pending (scheduled) / in flight (claimed) / idle, as ``Message.state`` says."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("pending", "pending"), ("inflight", "in flight"), ("idle", "idle")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "pending":
            return queryset.filter(due_at__isnull=False)
        if value == "inflight":
            return queryset.filter(inflight_deadline__isnull=False)
        if value == "idle":
            return queryset.filter(due_at__isnull=True, inflight_deadline__isnull=True)
        return queryset


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


# --------------------------------------------------------------------------- queue cells


class QueueCellAdmin(OperatorModelAdmin):
    """The queue dashboard: one row per cell in the list, one page per cell."""

    list_display = ("name", "pending", "in_flight", "dead_letters", "next_alarm", "oldest_due", "shards")
    ordering = ("name",)
    change_list_template = "admin/queueing/queuecell/change_list.html"
    change_form_template = "admin/queueing/queuecell/change_form.html"
    fields = ("name", "shards", "pinned")
    readonly_fields = ("name", "shards", "pinned")

    def get_queryset(self, request):
        msgs = Message.objects.filter(cell_id=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_pending=_count(msgs.filter(due_at__isnull=False)),
                n_inflight=_count(msgs.filter(inflight_deadline__isnull=False)),
                n_dead=_count(DeadLetter.objects.filter(cell_id=OuterRef("pk"))),
                first_due=Subquery(msgs.filter(due_at__isnull=False).order_by("due_at").values("due_at")[:1]),
            )
        )

    def _link(self, model: str, cell: QueueCell, n: int, **params: Any) -> str:
        url = reverse(f"admin:queueing_{model}_changelist") + query_string(cell__id__exact=cell.pk, **params)
        return format_html('<a href="{}">{}</a>', url, f"{n:,}")

    @admin.display(description="pending", ordering="n_pending")
    def pending(self, obj: QueueCell) -> str:
        return self._link("message", obj, obj.n_pending, state="pending")

    @admin.display(description="in flight", ordering="n_inflight")
    def in_flight(self, obj: QueueCell) -> str:
        return self._link("message", obj, obj.n_inflight, state="inflight")

    @admin.display(description="dead letters", ordering="n_dead")
    def dead_letters(self, obj: QueueCell) -> str:
        return self._link("deadletter", obj, obj.n_dead)

    @admin.display(description="next alarm", ordering="alarm_at")
    def next_alarm(self, obj: QueueCell) -> str:
        return format_epoch_ms(obj.alarm_at, late_after_ms=ALARM_LATE_MS) if obj.alarm_at is not None else "none"

    @admin.display(description="oldest due message")
    def oldest_due(self, obj: QueueCell) -> str:
        return _oldest_due(obj.first_due, clock.now_ms())

    @admin.display(description="shards pinned")
    def shards(self, obj: QueueCell) -> str:
        return "—" if obj.queue_shards is None else str(obj.queue_shards)

    @admin.display(description="pinned at")
    def pinned(self, obj: QueueCell) -> str:
        return format_epoch_ms(obj.pinned_at)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("live/", self.admin_site.admin_view(self.live_view), name="%s_%s_live" % info),
        ] + super().get_urls()

    def live_view(self, request):
        """``live/``: the dashboard's self-refreshing fragment (``queueing.console.live_context``), polled by htmx."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return TemplateResponse(request, "admin/queueing/queuecell/live.html", console.live_context())

    def changelist_view(self, request, extra_context=None):
        """The dashboard over all cells: the live fragment (totals, outcome chart, drivers) above the per-cell rows."""
        context = {
            **console.live_context(),
            "lifecycle": _lifecycle_context(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self._cell_page(obj))
            context["title"] = f"Queue cell {obj.name}"
            context["subtitle"] = None
            context["can_purge"] = request.user.has_perm("queueing.purge_deadletter")
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _cell_page(self, cell: QueueCell) -> dict[str, Any]:
        """Context of a cell's page: service stats, due-next, in-flight and latest dead letters."""
        now = clock.now_ms()
        stats = QueueCellService(cell.name).stats()
        body = display.payload_annotations("body", head=display.INLINE_HEAD_CHARS)
        due = list(
            Message.objects.filter(cell=cell, due_at__isnull=False)
            .defer("body").annotate(**body).order_by("due_at", "message_id")[:CELL_PAGE_ROWS]
        )
        inflight = list(
            Message.objects.filter(cell=cell, inflight_deadline__isnull=False)
            .defer("body").annotate(**body).order_by("inflight_deadline", "message_id")[:CELL_PAGE_ROWS]
        )
        dead = list(
            DeadLetter.objects.filter(cell=cell).defer("body").annotate(**body).order_by("-dlq_key")[:CELL_PAGE_ROWS]
        )
        msg_url = reverse("admin:queueing_message_changelist")

        def message_row(m: Message) -> dict[str, Any]:
            return {
                "m": m,
                "url": reverse("admin:queueing_message_change", args=[m.pk]),
                "due": format_epoch_ms(m.due_at, now_ms=now),
                "deadline": format_epoch_ms(m.inflight_deadline, now_ms=now, late_after_ms=0),
                "started": format_epoch_ms(m.delivery_started_at, now_ms=now),
                "error": _error_cell(m.last_error),
                "body": display.render_queue_body(display.stored_text(m, "body"), inline=True),
            }

        return {
            "stats": stats,
            "alarm": format_epoch_ms(stats["alarmAt"], now_ms=now, late_after_ms=ALARM_LATE_MS)
            if stats["alarmAt"] is not None else "none",
            "alarm_late": stats["alarmAt"] is not None and now - stats["alarmAt"] > ALARM_LATE_MS,
            "oldest_due": _oldest_due(due[0].due_at if due else None, now),
            "pending_url": msg_url + query_string(cell__id__exact=cell.pk, state="pending"),
            "inflight_url": msg_url + query_string(cell__id__exact=cell.pk, state="inflight"),
            "dead_url": reverse("admin:queueing_deadletter_changelist") + query_string(cell__id__exact=cell.pk),
            "purge_url": reverse("admin:queueing_deadletter_purge_all") + query_string(cell=cell.pk),
            "due_rows": [message_row(m) for m in due],
            "inflight_rows": [message_row(m) for m in inflight],
            "dead_rows": [
                {
                    "d": d,
                    "url": reverse("admin:queueing_deadletter_change", args=[d.pk]),
                    "failed": format_epoch_ms(d.failed_at, now_ms=now),
                    "error": _error_cell(d.last_error),
                    "body": display.render_queue_body(display.stored_text(d, "body"), inline=True),
                }
                for d in dead
            ],
            "max_inflight": config.max_inflight(),
        }


# --------------------------------------------------------------------------- messages


def _attempts_fieldset() -> tuple:
    return ("Attempts", {"fields": ("attempt_log",), "description": "Failed POSTs, newest first (UTC)."})


class _StoredMessageAdmin:
    """What the message and dead-letter pages share: exact search, body previews, the run link.

    Both rows keep the body codec-encoded in ``body``: lists load a short
    preview of it (``display.payload_annotations``), a detail page a long one.
    """

    search_fields = ("message_id",)  # shows the search box; the search itself is get_search_results
    search_help_text = "Exact match on a message id, idempotency key or queue name."
    list_select_related = ("cell",)

    def get_queryset(self, request):
        """Rows with a short preview of the body instead of the body."""
        return (
            super().get_queryset(request).defer("body")
            .annotate(**display.payload_annotations("body", head=display.INLINE_HEAD_CHARS))
        )

    def get_object(self, request, object_id, from_field=None):
        """One row with a long preview of its body; None when there is no such row."""
        pk = row_pk(object_id)
        if pk is None:
            return None
        try:
            return (
                super().get_queryset(request).select_related("cell").defer("body")
                .annotate(**display.payload_annotations("body")).get(pk=pk)
            )
        except self.model.DoesNotExist:
            return None

    def get_search_results(self, request, queryset, search_term):
        return _exact_search(queryset, search_term)

    @admin.display(description="enqueued")
    def enqueued(self, obj) -> str:
        return format_epoch_ms(obj.enqueued_at)

    @admin.display(description="body")
    def body_preview(self, obj) -> str:
        stored = display.stored_text(obj, "body")
        return format_html(
            '<div class="wc-clip" title="{}">{}</div>', console.body_title(stored),
            display.render_queue_body(stored, inline=True, budget=LIST_PREVIEW_CHARS),
        )

    @admin.display(description="body")
    def body_display(self, obj) -> str:
        return display.render_queue_body(display.stored_text(obj, "body"))

    @admin.display(description="run")
    def run(self, obj) -> str:
        return _run_link(display.stored_text(obj, "body")) or "—"

    @admin.display(description="attempt log")
    def attempt_log(self, obj) -> str:
        return console.attempt_log_html(obj.cell_id, obj.message_id)


class MessageAdmin(_StoredMessageAdmin, OperatorModelAdmin):
    """Live queue messages, read-only: what is due, what is in flight, why deliveries fail."""

    list_display = (
        "message_id", "cell", "state_badge", "queue_name", "attempt", "last_error_short", "next_event", "body_preview",
    )
    list_filter = ("cell", StateFilter, "pathname")
    ordering = ("cell", "due_at", "message_id")
    fieldsets = (
        (None, {"fields": ("message_id", "cell", "state_badge", "queue_name", "pathname", "target_base_url",
                           "idempotency_key", "run")}),
        ("Delivery", {"fields": ("attempt", "deliveries", "last_status", "last_error", "last_attempt",
                                 "enqueued", "due", "claim_deadline", "delivery_started", "updated")}),
        _attempts_fieldset(),
        ("Body", {"fields": ("body_display",)}),
    )
    readonly_fields = (
        "message_id", "cell", "state_badge", "queue_name", "pathname", "target_base_url", "idempotency_key", "run",
        "attempt", "deliveries", "last_status", "last_error", "last_attempt", "enqueued", "due", "claim_deadline",
        "delivery_started", "updated", "body_display", "attempt_log",
    )

    @admin.display(description="state")
    def state_badge(self, obj: Message) -> str:
        return status_badge(obj.state)

    @admin.display(description="last error")
    def last_error_short(self, obj: Message) -> str:
        if obj.last_error is None and obj.last_status is not None:
            return f"HTTP {obj.last_status}"
        return _error_cell(obj.last_error)

    @admin.display(description="due", ordering="due_at")
    def due(self, obj: Message) -> str:
        return format_epoch_ms(obj.due_at)

    @admin.display(description="due / claim deadline", ordering="due_at")
    def next_event(self, obj: Message) -> str:
        """When the message is due (pending) or when its claim expires (in flight)."""
        if obj.inflight_deadline is not None:
            return format_html("claim until {}", format_epoch_ms(obj.inflight_deadline, late_after_ms=0))
        if obj.due_at is not None:
            return format_html("due {}", format_epoch_ms(obj.due_at))
        return "—"

    @admin.display(description="claim deadline", ordering="inflight_deadline")
    def claim_deadline(self, obj: Message) -> str:
        return format_epoch_ms(obj.inflight_deadline, late_after_ms=0)

    @admin.display(description="delivery started")
    def delivery_started(self, obj: Message) -> str:
        return format_epoch_ms(obj.delivery_started_at)

    @admin.display(description="last attempt")
    def last_attempt(self, obj: Message) -> str:
        return format_epoch_ms(obj.last_attempt_at)

    @admin.display(description="updated")
    def updated(self, obj: Message) -> str:
        return format_epoch_ms(obj.updated_at)


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


admin.site.register(QueueCell, QueueCellAdmin)
admin.site.register(Message, MessageAdmin)
admin.site.register(DeadLetter, DeadLetterAdmin)
