"""The queue dashboard of the console: one row per queue cell in the list, one page per cell.

The list is the dashboard of every shard (pending, in flight, dead letters,
next alarm, age of the oldest due message, with links into the messages),
under the self-refreshing fragment of ``queueing.console`` (totals, outcome
chart, drivers) and the retention settings (``cells.admin_lifecycle``); a
cell's page adds the messages due next, the claims in flight and the latest
dead letters. Counts come from the queue service's own ``stats``
(``QueueCell(name).stats()``).
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from worldcell import clock, display
from worldcell.admin_site import OperatorModelAdmin, format_duration_ms, format_epoch_ms, query_string

from . import config, console
from .admin_messages import _error_cell
from .models import DeadLetter, Message, QueueCell
from .service import QueueCell as QueueCellService

__all__ = ["ALARM_LATE_MS", "CELL_PAGE_ROWS", "QueueCellAdmin"]

#: Rows of each list on a queue cell's page.
CELL_PAGE_ROWS = 20
#: An alarm or due message this late (ms) means no driver is firing the cell: shown in red.
ALARM_LATE_MS = 5_000


def _count(qs) -> Coalesce:
    """``COUNT(*)`` of ``qs`` per cell as a correlated subquery (0 when none)."""
    return Coalesce(Subquery(qs.order_by().values("cell_id").annotate(n=Count("*")).values("n")), Value(0))


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
