"""Console pages of the run lifecycle (docs/lifecycle.md §8): tombstones, and the hooks other pages call.

* ``RunTombstoneAdmin`` — the read-only list and page of expired runs: what
  the run was, why and when it expired, how far its cleanup is.
* ``tombstone_url(run_id)`` — the page of a run's tombstone (the run list and
  ``by-id`` links of an expired run lead there).
* ``stuck_note(run_id)`` — "stuck since …" for the run page.
* ``dashboard_context()`` — the retention settings and last sweep for the
  queue dashboard.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from worldcell import clock, codec
from worldcell.admin_site import OperatorModelAdmin

from . import lifecycle, repair
from .models import RunTombstone

__all__ = ["RunTombstoneAdmin", "dashboard_context", "stuck_note", "tombstone_url"]


class RunTombstoneAdmin(OperatorModelAdmin):
    """Expired runs (tombstones): read-only."""

    list_display = ("run_id", "workflow_name", "status", "reason", "expired_at", "tombstoned_at", "cleanup")
    list_filter = ("status", "reason", "phase")
    search_fields = ("run_id",)
    search_help_text = "Exact match on a run id."
    ordering = ("-tombstoned_at",)
    fields = ("run_id", "expired_note", "workflow_name", "deployment_id", "status", "reason", "created_at",
              "started_at", "completed_at", "updated_at", "expired_at", "tombstoned_at", "cleanup", "cleaned_at",
              "deleted", "attempts", "last_error")
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        return (queryset.filter(run_id=term) if term else queryset), False

    @admin.display(description="state")
    def expired_note(self, obj: RunTombstone) -> str:
        return format_html('<span class="wc-badge wc-st-cancelled">expired run</span> its data was deleted by '
                           "retention; the fleet answers RunExpiredError (410) for it")

    @admin.display(description="cleanup")
    def cleanup(self, obj: RunTombstone) -> str:
        return "finished" if obj.phase == "done" else f"in progress ({obj.phase})"


admin.site.register(RunTombstone, RunTombstoneAdmin)


def tombstone_url(run_id: str) -> str | None:
    """The console page of ``run_id``'s tombstone, or None when the run has none."""
    pk = RunTombstone.objects.filter(run_id=run_id).values_list("pk", flat=True).first()
    return None if pk is None else reverse("admin:cells_runtombstone_change", args=[pk])


def stuck_note(run: Any) -> str | None:
    """``stuck since <ISO> (<n> min)`` when ``run`` (a ``Run``) is stuck (docs/lifecycle.md §7), else None.

    No query for a terminal run or one updated within the threshold (the
    common case): a run's last event is never older than its ``updated_at``.
    """
    after = repair.threshold_ms()
    if after is None or run.status not in ("pending", "running"):
        return None
    if clock.now_ms() - codec.epoch_ms(codec.to_utc_ms(run.updated_at)) < after:
        return None
    since = repair.stuck_since(run.cell.name)
    if since is None:
        return None
    minutes = (clock.now_ms() - since) // 60_000
    return f"stuck since {codec.format_iso(codec.from_epoch_ms(since))} ({minutes} min): nothing will resume it"


def dashboard_context() -> dict[str, Any]:
    """Retention settings and the last sweep, for the queue dashboard."""
    st = lifecycle.status()
    last = st["lastResult"] or {}
    finished = st["lastFinishedAt"]
    return {
        "retention": lifecycle.describe_ms(st["retentionMs"]),
        "max_age": lifecycle.describe_ms(st["maxAgeMs"]),
        "batch": st["batch"],
        "tombstones": st["tombstones"],
        "cleaning": st["cleaning"],
        "last_sweep": codec.format_iso(codec.from_epoch_ms(finished)) if finished else "never",
        "last_expired": last.get("expired", 0),
        "last_rate": last.get("rate", 0),
        "stuck_after": lifecycle.describe_ms(repair.threshold_ms()),
        "tombstones_url": reverse("admin:cells_runtombstone_changelist"),
    }
