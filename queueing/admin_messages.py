"""The console's queue messages, and what their page shares with the dead letters' (``_StoredMessageAdmin``).

* **Messages** (``MessageAdmin``) — live messages with attempts,
  deliveries, last error and status, due time, claim deadline and a body
  preview; read-only; filtered by cell, state (``StateFilter``) and pathname.
* ``_StoredMessageAdmin`` — the mixin of the message and dead-letter pages:
  exact search on message id, idempotency key or queue name, body previews,
  the link to the run a body concerns, the attempt log
  (``queueing.console``, docs/queue-console.md); with ``_error_cell`` and
  ``_attempts_fieldset``, the columns and fieldset both pages show.
"""
from __future__ import annotations

from django.contrib import admin
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

from worldcell import display
from worldcell.admin_site import OperatorModelAdmin, format_epoch_ms, row_pk, status_badge

from . import console
from .models import Message

__all__ = ["LIST_PREVIEW_CHARS", "MessageAdmin", "StateFilter"]

#: Visible characters of a body preview in a list.
LIST_PREVIEW_CHARS = 120


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
