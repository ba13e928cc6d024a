"""The operator console for runs: the run list, the run page, step and event pages, "Cancel run".

Everything here is read-only except "Cancel run", which records a real
``run_cancelled`` event through the runs service (``cells.operations``) and
needs the ``cells.cancel_run`` permission.

* **Run list** — run id, workflow, status badge, deployment, created,
  duration; filters by status, workflow name, deployment, created date;
  exact search by run id, workflow name, step or hook id, hook token; newest
  first. Fast on a million runs: indexed filters, a capped count, the run
  cell joined in the same query, payload columns never loaded.
* **Run page** — summary, decoded input/output/error/executionContext, the
  steps, the event log as a timeline (links to the step page or the hook),
  the live hooks and the run's streams (``run-streams:<runId>`` registry,
  ``stream:<name>`` chunks). Each section reads one page of rows with
  bounded previews (``worldcell.display``), so a run with a 5 MB output or
  10,000 events renders in a handful of queries.
* **Step page** and **event page** under the run's URL, with full decoded
  payloads (bounded) and the step's own events.
* Console v2 (docs/console.md): the run page's **waterfall**
  (``cells.admin_waterfall``), the run list's status counts, failure reason,
  substring search and run-id jump (``cells.admin_runlist``), the **stream
  viewer** and download (``cells.admin_streams``), and **live pages**: the run
  list's results and the run page's sections are htmx-polled fragments
  (``?_fragment=results``, ``<run>/live/``).

Where the pieces live: the run page's fields, sections and sub-pages in
``cells.admin_runpage`` (``RunPageMixin``), the run actions in
``cells.admin_actions`` (``RunActionsMixin``), the tombstone pages in
``cells.admin_lifecycle``. This module holds the registration, the list's
columns and queries, the URLs, the thin views (the list's fragment, the
stream pages, the run-id jump, ``by-id``) and "Cancel run".
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.conf import settings
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import MAX_URL_REDIRECT_LENGTH

from worldcell import clock, codec, display
from worldcell.admin_site import (
    OperatorModelAdmin,
    distinct_values_filter,
    format_datetime,
    format_duration_ms,
    row_pk,
    status_badge,
)

from . import admin_runlist, admin_streams, operator_actions
from .admin_actions import BULK_MAX_RUNS, RunActionsMixin
from .admin_runlist import run_duration_ms
from .admin_runpage import LIVE_EVERY_S, RunPageMixin, id_or_404
from .event_machine import TERMINAL_RUN
from .models import Run
from .operations import CancelResult, cancel_run


#: Runs one cancel request may touch (a "select all" over a million runs is refused): the bulk cap.
CANCEL_MAX_RUNS = BULK_MAX_RUNS

RUN_PAYLOADS = ("input", "output", "error", "execution_context")


class RunAdmin(RunPageMixin, RunActionsMixin, OperatorModelAdmin):
    """Runs: the list, the run page (``cells.admin_runpage``), "Cancel run", the actions of ``cells.admin_actions``."""

    list_display = ("run_id", "workflow_name", "status_badge", "deployment", "created", "duration", "failure")
    list_display_links = ("run_id",)
    list_filter = (
        admin_runlist.StatusCountFilter,
        distinct_values_filter("workflow_name", "workflow name"),
        distinct_values_filter("deployment_id", "deployment"),
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("cell__name",)  # shows the search box; the search itself is get_search_results
    search_help_text = (
        "Part of a run id, workflow name or deployment id (case-insensitive), or an exact step id, "
        "hook id or hook token."
    )
    change_list_template = "admin/cells/run/change_list.html"
    ordering = ("-created_at",)
    list_select_related = ("cell",)
    actions = ("cancel_selected_runs", "rerun_selected_runs")
    change_form_template = "admin/cells/run/change_form.html"
    fieldsets = (
        (None, {"fields": ("run_id", "status_summary", "workflow_name", "deployment_summary", "times", "record_counts")}),
        ("Payloads", {"fields": ("input_display", "output_display", "error_display", "execution_context_display")}),
    )
    readonly_fields = (
        "run_id",
        "status_summary",
        "workflow_name",
        "deployment_summary",
        "times",
        "record_counts",
        "input_display",
        "output_display",
        "error_display",
        "execution_context_display",
    )

    # ------------------------------------------------------------------ queries

    def get_queryset(self, request):
        """Runs with their cell (the run id) joined; payload columns are never loaded here.

        Expired runs (being cleaned up) are left out: their tombstones have their own list.
        """
        return (
            super().get_queryset(request).select_related("cell").defer(*RUN_PAYLOADS).filter(cell__expired=False)
            .annotate(**admin_runlist.failure_annotation())
        )

    def get_object(self, request, object_id, from_field=None):
        """The run with previews of its payloads (head, size, tail) instead of the payloads."""
        annotations: dict[str, Any] = {}
        for name in RUN_PAYLOADS:
            annotations.update(display.payload_annotations(name))
        try:
            pk = row_pk(object_id)
            return None if pk is None else self.get_queryset(request).annotate(**annotations).get(pk=pk)
        except Run.DoesNotExist:
            return None

    def get_search_results(self, request, queryset, search_term):
        """Substring search over run id, workflow name, deployment; exact step/hook id and hook token.

        ``cells.admin_runlist.search_runs`` (trigram indexes on PostgreSQL, a
        bounded scan on SQLite; docs/console.md "Search").
        """
        return admin_runlist.search_runs(queryset, search_term), False

    # ------------------------------------------------------------------ list columns

    @admin.display(description="run id", ordering="cell__name")
    def run_id(self, obj: Run) -> str:
        return obj.cell.name

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Run) -> str:
        return status_badge(obj.status)

    @admin.display(description="deployment", ordering="deployment_id")
    def deployment(self, obj: Run) -> str:
        return obj.deployment_id

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Run) -> str:
        return format_datetime(obj.created_at)

    @admin.display(description="duration")
    def duration(self, obj: Run) -> str:
        ms, going = run_duration_ms(obj, clock.now_ms())
        if ms is None:
            return "—"
        if going:
            return format_html('<span class="wc-rel" title="still {}: time so far">≥ {}</span>', obj.status, format_duration_ms(ms))
        return format_duration_ms(ms)

    @admin.display(description="failure reason")
    def failure(self, obj: Run) -> str:
        reason = admin_runlist.failure_reason(getattr(obj, "wc_error_head", None))
        if not reason:
            return ""
        return format_html('<span class="wc-error" title="{}">{}</span>', reason, reason)

    # ------------------------------------------------------------------ the run page
    # (its fields, sections and sub-pages: cells.admin_runpage.RunPageMixin)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self._run_sections(request, obj))
            context["title"] = f"Run {obj.cell.name}"
            context["subtitle"] = None
            context["can_cancel"] = self.has_cancel_permission(request) and obj.status not in TERMINAL_RUN
            context.update(self.run_page_actions(request, obj))  # cells.admin_actions
            # a run with a live hook is parked, never stuck (docs/lifecycle.md §7): no query then
            context["stuck_note"] = None if context.get("hook_rows") else admin_lifecycle.stuck_note(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # ------------------------------------------------------------------ URLs

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("by-id/<path:run_id>/", wrap(self.by_id_view), name="%s_%s_by_id" % info),
            path("<int:object_id>/cancel/", wrap(self.cancel_view), name="%s_%s_cancel" % info),
            path("<int:object_id>/step/", wrap(self.step_view), name="%s_%s_step" % info),
            path("<int:object_id>/event/<str:event_id>/", wrap(self.event_view), name="%s_%s_event" % info),
            *self.action_urls(),
            path("<int:object_id>/live/", wrap(self.live_view), name="%s_%s_live" % info),
            path("<int:object_id>/stream/", wrap(self.stream_view), name="%s_%s_stream" % info),
            path("<int:object_id>/stream/download/", wrap(self.stream_download_view), name="%s_%s_stream_download" % info),
            path("jump/", wrap(self.jump_view), name="%s_%s_jump" % info),
        ] + super().get_urls()

    # ------------------------------------------------------------------ console v2 views

    def changelist_view(self, request, extra_context=None):
        """The run list; ``?_fragment=results`` answers only its results table (the live fragment)."""
        fragment = request.GET.get("_fragment") == "results"
        if fragment:
            request.GET = request.GET.copy()
            del request.GET["_fragment"]
        query = request.GET.copy()
        query["_fragment"] = "results"
        context = {
            "jump_url": reverse("admin:cells_run_jump"),
            "results_fragment_url": f"{request.path}?{query.urlencode()}",
            "live_every_s": LIVE_EVERY_S,
            "live_every": f"{LIVE_EVERY_S} s",
            "live_now": format_datetime(codec.from_epoch_ms(clock.now_ms())),
            "time_zone_name": settings.TIME_ZONE,
            **(extra_context or {}),
        }
        response = super().changelist_view(request, context)
        if fragment and isinstance(response, TemplateResponse):
            response.template_name = "admin/cells/run/run_results.html"
        return response

    def stream_view(self, request, object_id: int):
        """``<run>/stream/?name=…&from=…&as=text|json|hex``: every chunk of a run's stream, a page at a time."""
        run = self._run_or_404(request, object_id)
        name = id_or_404(request.GET.get("name"), "stream")
        try:
            start = max(0, int(request.GET.get("from") or 0))
        except ValueError:
            start = 0
        page = admin_streams.stream_page(run.cell.name, name, start, request.GET.get("as") or "text")
        context = self._page_context(request, run, f"Stream {name}")
        base = reverse("admin:cells_run_stream", args=[run.pk]) + "?" + urlencode({"name": name})
        context.update(
            page,
            base_url=base,
            download_url=reverse("admin:cells_run_stream_download", args=[run.pk]) + "?" + urlencode({"name": name}),
            end_index=page["start"] + max(len(page["chunk_rows"]) - 1, 0),
            updated=format_datetime(page["stream"].updated_at) if page["stream"] is not None else "—",
            time_zone_name=settings.TIME_ZONE,
        )
        return TemplateResponse(request, "admin/cells/run/stream.html", context)

    def stream_download_view(self, request, object_id: int):
        """``<run>/stream/download/?name=…``: the whole stream, streamed (``cells.admin_streams``)."""
        run = self._run_or_404(request, object_id)
        return admin_streams.stream_download(run.cell.name, id_or_404(request.GET.get("name"), "stream"))

    def jump_view(self, request):
        """``jump/?prefix=…``: the run page when exactly one run id starts with the prefix, else the filtered list."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        prefix = (request.GET.get("prefix") or "").strip()
        found = admin_runlist.runs_with_prefix(prefix)
        if len(found) == 1:
            return HttpResponseRedirect(reverse("admin:cells_run_change", args=[found[0][0]]))
        if found:
            self.message_user(request, f"More than one run id starts with {prefix!r}: the matching runs are listed.")
        elif prefix:
            shown = prefix if len(prefix) <= 80 else prefix[:80] + "…"
            self.message_user(request, f"No run id starts with {shown!r}.", messages.WARNING)
        target = reverse("admin:cells_run_changelist") + ("?" + urlencode({"q": prefix}) if prefix else "")
        if len(target) > MAX_URL_REDIRECT_LENGTH:  # a prefix far longer than any run id
            target = reverse("admin:cells_run_changelist")
        return HttpResponseRedirect(target)

    def by_id_view(self, request, run_id: str):
        """``/admin/cells/run/by-id/<runId>/`` -> the run page (for links from other pages), or its tombstone."""
        run_id = id_or_404(run_id, "run")
        tomb = admin_lifecycle.tombstone_url(run_id) if self.has_view_permission(request) else None
        if tomb is not None:
            return HttpResponseRedirect(tomb)
        run = self._run_or_404_by_name(request, run_id)
        return HttpResponseRedirect(reverse("admin:cells_run_change", args=[run.pk]))

    def _run_or_404_by_name(self, request, run_id: str) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), cell__name=id_or_404(run_id, "run"))


    # ------------------------------------------------------------------ cancel

    def has_cancel_permission(self, request) -> bool:
        """``cells.cancel_run`` (superusers have it)."""
        return request.user.is_active and request.user.has_perm("cells.cancel_run")

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def cancel_selected_runs(self, request, queryset):
        """Changelist action: a confirmation page, then ``cancel_run`` for each selected run."""
        runs = list(queryset.order_by()[: CANCEL_MAX_RUNS + 1])
        if len(runs) > CANCEL_MAX_RUNS:
            self.message_user(
                request,
                f"Refused: more than {CANCEL_MAX_RUNS} runs selected. Narrow the list with filters first.",
                messages.ERROR,
            )
            return None
        if request.POST.get("post") != "yes":
            return self._cancel_confirmation(request, runs, action=True)
        results = self._cancel(request, runs)
        return self.results_page(request, "cancel", runs, [operator_actions.cancel_result(r) for r in results])

    def cancel_view(self, request, object_id: int):
        """``<run>/cancel/``: GET asks for confirmation, POST cancels the run."""
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        run = self._run_or_404(request, object_id)
        if request.method == "POST" and request.POST.get("post") == "yes":
            self._cancel(request, [run])
            return HttpResponseRedirect(reverse("admin:cells_run_change", args=[run.pk]))
        return self._cancel_confirmation(request, [run], action=False)

    def _cancel_confirmation(self, request, runs: list[Run], *, action: bool):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Cancel runs?" if len(runs) != 1 else f"Cancel run {runs[0].cell.name}?",
            "subtitle": None,
            "runs": [
                {
                    "run": r,
                    "url": reverse("admin:cells_run_change", args=[r.pk]),
                    "status": status_badge(r.status),
                    "terminal": r.status in TERMINAL_RUN,
                }
                for r in runs
            ],
            "action": action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "cap": CANCEL_MAX_RUNS,
        }
        return TemplateResponse(request, "admin/cells/run/cancel_confirmation.html", context)

    def _cancel(self, request, runs: list[Run]) -> list[CancelResult]:
        """Cancel each run, report per run, and record every attempt in the admin log."""
        results = []
        entries = []
        by_id = {r.cell.name: r for r in runs}
        for run in runs:
            result = cancel_run(run.cell.name)
            results.append(result)
            if result.cancelled:
                hooks = ", ".join(h["hookId"] for h in result.released_hooks) or "none"
                text = f"Cancelled with event {result.event_id} (released hooks: {hooks})"
                if result.index_error:
                    text += f"; index update failed: {result.index_error}"
            else:
                text = f"Cancel refused: {result.message}"
            entries.append((by_id[result.run_id], text))
        content_type = ContentType.objects.get_for_model(Run)
        LogEntry.objects.bulk_create(
            [
                LogEntry(
                    user_id=request.user.pk,
                    content_type=content_type,
                    object_id=str(run.pk),
                    object_repr=f"run {run.cell.name}"[:200],
                    action_flag=CHANGE,
                    change_message=text,
                )
                for run, text in entries
            ]
        )
        done = [r for r in results if r.cancelled]
        refused = [r for r in results if not r.cancelled]
        if done:
            released = sum(len(r.released_hooks) for r in done)
            self.message_user(
                request,
                f"Cancelled {len(done)} run{'s' if len(done) != 1 else ''} "
                f"({released} hook{'s' if released != 1 else ''} released and un-indexed).",
                messages.SUCCESS,
            )
        for r in done:
            if r.index_error:
                self.message_user(
                    request,
                    f"{r.run_id}: cancelled, but the index update failed ({r.index_error}); "
                    "runs.list may still show the old status.",
                    messages.WARNING,
                )
        if refused:
            lines = "; ".join(f"{r.run_id}: {r.message}" for r in refused[:20])
            more = f" (and {len(refused) - 20} more)" if len(refused) > 20 else ""
            self.message_user(
                request,
                f"Could not cancel {len(refused)} run{'s' if len(refused) != 1 else ''}: {lines}{more}",
                messages.WARNING if done else messages.ERROR,
            )
        return results


admin.site.register(Run, RunAdmin)

from . import admin_lifecycle  # noqa: E402 - registers the tombstone pages (docs/lifecycle.md §8)
