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
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.conf import settings
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import MAX_URL_REDIRECT_LENGTH

from worldcell import clock, codec, display
from worldcell.keys import storable_text
from worldcell.admin_site import (
    OperatorModelAdmin,
    distinct_values_filter,
    format_datetime,
    format_duration_ms,
    row_pk,
    row_pk_or_404,
    status_badge,
)

from . import admin_runlist, admin_streams, admin_waterfall, operator_actions
from .admin_actions import BULK_MAX_RUNS, RunActionsMixin
from .event_machine import TERMINAL_RUN
from .models import Event, Hook, HookMarker, Run, Step, Stream, StreamChunk, StreamRegistration
from .operations import CancelResult, cancel_run


def _id_or_404(text: str | None, what: str) -> str:
    """``text`` as a string id to look up (run, step, event id, a page cursor), or Http404.

    The console's one check of ids taken from a URL: a string no text column can hold
    (``worldcell.keys.storable_text``: a U+0000, an unpaired surrogate) names nothing, so it
    is "not found", never a query PostgreSQL refuses (DataError, an HTML 500).
    """
    if text is None or not storable_text(text):
        raise Http404(f"no such {what}")
    return text

#: Runs one cancel request may touch (a "select all" over a million runs is refused): the bulk cap.
CANCEL_MAX_RUNS = BULK_MAX_RUNS
#: Rows per page of the run page's sections.
STEPS_PER_PAGE = 100
EVENTS_PER_PAGE = 250
HOOKS_SHOWN = 200
STREAMS_SHOWN = 50
STEP_EVENTS_SHOWN = 500
#: Bytes of a stream chunk read for its preview.
CHUNK_PREVIEW_BYTES = 96
#: Seconds between two refreshes of a live fragment (run list results, run page sections).
LIVE_EVERY_S = 5

RUN_PAYLOADS = ("input", "output", "error", "execution_context")
STEP_PAYLOADS = ("input", "output", "error")


def _event_family(event_type: str) -> str:
    """``run`` / ``step`` / ``hook`` / ``wait``: the timeline colour of an event type."""
    return event_type.split("_", 1)[0]


def _run_duration_ms(run: Run, now_ms: int) -> tuple[int | None, bool]:
    """``(duration ms, still going)``: completedAt (or now) minus startedAt (or createdAt)."""
    start = run.started_at or run.created_at
    if start is None:
        return None, False
    if run.completed_at is not None:
        return codec.epoch_ms(run.completed_at) - codec.epoch_ms(start), False
    if run.status in TERMINAL_RUN:
        return None, False
    return now_ms - codec.epoch_ms(start), True


def _error_line(stored: display.StoredText | None, *, earlier: bool = False) -> str:
    """One line for a StructuredError column: its ``message`` (and ``code``), else an inline preview.

    ``earlier``: the error of an attempt before the one that succeeded (a completed step keeps
    its last retry's error), shown muted and labelled so, not as a failure.
    """
    if stored is None:
        return ""
    if earlier:
        return format_html('<span class="wc-rel" title="a failed attempt before the one that completed">'
                           'earlier attempt: {}</span>', _error_line(stored))
    try:
        if stored.complete:
            value = codec.decode(stored.head)
        else:
            value, _ = display.parse_json_prefix(stored.head)
    except ValueError:
        return display.render_payload(stored, inline=True)
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        message = value["message"]
        short = message if len(message) <= 200 else message[:199] + "…"
        code = value.get("code")
        return format_html(
            '<span class="wc-error" title="{}">{}{}</span>',
            message[:2000],
            format_html('<code class="wc-code">{}</code> ', code) if isinstance(code, str) else "",
            short,
        )
    return display.render_payload(stored, inline=True)


def _event_data_preview(stored: display.StoredText) -> str:
    """The ``eventData`` of a stored event body, on one line (empty when the event has none)."""
    try:
        if stored.complete:
            body = codec.decode(stored.head)
            complete = True
        else:
            body, complete = display.parse_json_prefix(stored.head)
    except ValueError:
        return display.render_payload(stored, inline=True)
    if not isinstance(body, dict) or "eventData" not in body:
        if complete or not isinstance(body, dict):
            return ""
        return format_html('<span class="wc-cut">… ({} event)</span>', display.format_size(stored.size))
    preview = display.render_value(body["eventData"], inline=True)
    if not complete and isinstance(body, display.PartialDict) and len(body) <= 3:
        preview = format_html('{} <span class="wc-size">· {} event</span>', preview, display.format_size(stored.size))
    return preview


class RunAdmin(RunActionsMixin, OperatorModelAdmin):
    """Runs: the list, the run page, "Cancel run" and the actions of ``cells.admin_actions``."""

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
        ms, going = _run_duration_ms(obj, clock.now_ms())
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

    @admin.display(description="status")
    def status_summary(self, obj: Run) -> str:
        ms, going = _run_duration_ms(obj, clock.now_ms())
        if ms is None:
            return status_badge(obj.status)
        took = f"{format_duration_ms(ms)} so far" if going else f"took {format_duration_ms(ms)}"
        return format_html('{} <span class="wc-rel">{}</span>', status_badge(obj.status), took)

    @admin.display(description="deployment")
    def deployment_summary(self, obj: Run) -> str:
        version = "—" if obj.spec_version is None else (
            str(int(obj.spec_version)) if float(obj.spec_version).is_integer() else str(obj.spec_version)
        )
        return format_html('{} <span class="wc-rel">· spec version {}</span>', obj.deployment_id, version)

    @admin.display(description=f"times ({settings.TIME_ZONE})")
    def times(self, obj: Run) -> str:
        day = obj.created_at
        return format_html(
            "created {} · started {} · completed {} · updated {}",
            format_datetime(obj.created_at),
            format_datetime(obj.started_at, same_day_as=day),
            format_datetime(obj.completed_at, same_day_as=day),
            format_datetime(obj.updated_at, same_day_as=day),
        )

    @admin.display(description="records")
    def record_counts(self, obj: Run) -> str:
        counts = getattr(obj, "wc_counts", None)
        if counts is None:
            return "—"

        def n(count: int, noun: str) -> str:
            return f"{count:,} {noun}{'' if count == 1 else 's'}"

        return format_html(
            "{} · {} · {} of {} created",
            n(obj.cell.event_sequence, "event"), n(counts["steps"], "step"), n(counts["live_hooks"], "live hook"),
            f"{counts['hooks']:,}",
        )

    @admin.display(description="input")
    def input_display(self, obj: Run) -> str:
        return display.render_payload(display.stored_text(obj, "input"))

    @admin.display(description="output")
    def output_display(self, obj: Run) -> str:
        return display.render_payload(display.stored_text(obj, "output"))

    @admin.display(description="error")
    def error_display(self, obj: Run) -> str:
        return display.render_structured_error(display.stored_text(obj, "error"))

    @admin.display(description="execution context")
    def execution_context_display(self, obj: Run) -> str:
        return display.render_payload(display.stored_text(obj, "execution_context"))

    # ------------------------------------------------------------------ the run page

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

    def _run_sections(self, request, run: Run) -> dict[str, Any]:
        """Context of the run page: steps, timeline, hooks and streams (one page each)."""
        run_id = run.cell.name
        now_ms = clock.now_ms()
        created_ms = codec.epoch_ms(run.created_at)
        page_url = reverse("admin:cells_run_change", args=[run.pk])

        # steps: one page by creation order (the listSteps order), payloads as previews
        steps_after = request.GET.get("steps_after") or ""
        steps_qs = (
            Step.objects.filter(run=run)
            .defer(*STEP_PAYLOADS)
            .annotate(**display.payload_annotations("error", head=display.INLINE_HEAD_CHARS))
            .order_by("sort_key")
        )
        if steps_after:
            steps_qs = steps_qs.filter(sort_key__gt=steps_after)
        steps = list(steps_qs[: STEPS_PER_PAGE + 1])
        more_steps = len(steps) > STEPS_PER_PAGE
        steps = steps[:STEPS_PER_PAGE]
        step_url = reverse("admin:cells_run_step", args=[run.pk])
        step_rows = [
            {
                "step": s,
                "url": f"{step_url}?{urlencode({'id': s.step_id})}",
                "status": status_badge(s.status),
                "started": format_datetime(s.started_at, same_day_as=run.created_at),
                "completed": format_datetime(s.completed_at, same_day_as=run.created_at),
                "retry_after": format_datetime(s.retry_after, now_ms=now_ms, relative=True) if s.retry_after else "",
                "duration": format_duration_ms(
                    codec.epoch_ms(s.completed_at) - codec.epoch_ms(s.started_at)
                ) if s.completed_at and s.started_at else "",
                "error": _error_line(display.stored_text(s, "error"), earlier=s.status == "completed"),
            }
            for s in steps
        ]

        # counts: steps and hooks in one query each (events come from the cell's counter)
        counts = {
            "steps": Step.objects.filter(run=run).count(),
            "hooks": HookMarker.objects.filter(run=run).count(),
        }

        # hooks: the live ones (released/disposed hooks are gone; their events stay in the log)
        hooks = list(
            Hook.objects.filter(run=run)
            .defer("metadata")
            .annotate(**display.payload_annotations("metadata", head=display.INLINE_HEAD_CHARS))
            .order_by("sort_key")[:HOOKS_SHOWN]
        )
        counts["live_hooks"] = len(hooks) if len(hooks) < HOOKS_SHOWN else Hook.objects.filter(run=run).count()
        run.wc_counts = counts
        live_hook_ids = {h.hook_id for h in hooks}
        hook_rows = [
            {
                "hook": h,
                "anchor": f"hook-{h.pk}",
                "created": format_datetime(h.created_at, same_day_as=run.created_at),
                "metadata": display.render_payload(display.stored_text(h, "metadata"), inline=True),
            }
            for h in hooks
        ]
        hook_anchor = {h.hook_id: f"hook-{h.pk}" for h in hooks}

        # the event log: one page in log order, eventData previews from the head of each body
        events_after = request.GET.get("events_after") or ""
        events_qs = (
            Event.objects.filter(run=run)
            .defer("body")
            .annotate(**display.payload_annotations("body", head=display.INLINE_HEAD_CHARS))
            .order_by("event_id")
        )
        if events_after:
            events_qs = events_qs.filter(event_id__gt=_id_or_404(events_after, "event"))
        events = list(events_qs[: EVENTS_PER_PAGE + 1])
        more_events = len(events) > EVENTS_PER_PAGE
        events = events[:EVENTS_PER_PAGE]
        event_rows = []
        for e in events:
            family = _event_family(e.event_type)
            link = None
            note = ""
            if e.correlation_id:
                if family == "step":
                    link = f"{step_url}?{urlencode({'id': e.correlation_id})}"
                elif family == "hook":
                    if e.correlation_id in live_hook_ids:
                        link = f"#{hook_anchor[e.correlation_id]}"
                    else:
                        note = "hook no longer live"
            event_rows.append(
                {
                    "event": e,
                    "family": family,
                    "url": reverse("admin:cells_run_event", args=[run.pk, e.event_id]),
                    "time": format_datetime(e.created_at, same_day_as=run.created_at),
                    "offset": "+" + format_duration_ms(codec.epoch_ms(e.created_at) - created_ms),
                    "link": link,
                    "note": note,
                    "preview": _event_data_preview(display.stored_text(e, "body")),
                }
            )

        live_query = {k: v for k, v in (("steps_after", steps_after), ("events_after", events_after)) if v}
        waterfall = admin_waterfall.run_waterfall(
            run, now_ms, step_url=lambda sid: f"{step_url}?{urlencode({'id': sid})}"
        )
        ms, going = _run_duration_ms(run, now_ms)
        return {
            "run_id": run_id,
            "waterfall": waterfall,
            "waterfall_span": format_duration_ms(waterfall.span_ms),
            "waterfall_max_steps": admin_waterfall.MAX_STEP_LANES,
            "waterfall_max_events": admin_waterfall.MAX_TIMING_EVENTS,
            "live_url": reverse("admin:cells_run_live", args=[run.pk]) + (f"?{urlencode(live_query)}" if live_query else ""),
            "live_every_s": LIVE_EVERY_S,
            "live_every": f"{LIVE_EVERY_S} s",
            "live_status": self.status_summary(run),
            # a finished run no longer changes: its fragment comes back without the polling trigger
            "live_final": run.status in TERMINAL_RUN,
            "live_now": format_datetime(codec.from_epoch_ms(now_ms)),
            "time_zone_name": settings.TIME_ZONE,
            "step_rows": step_rows,
            "steps_total": counts["steps"],
            "steps_after": steps_after,
            "next_steps_url": f"{page_url}?{urlencode({'steps_after': steps[-1].sort_key})}#steps" if more_steps else None,
            "hook_rows": hook_rows,
            "hooks_total": counts["hooks"],
            "event_rows": event_rows,
            "events_total": run.cell.event_sequence,
            "events_after": events_after,
            "next_events_url": (
                f"{page_url}?{urlencode({'events_after': events[-1].event_id})}#timeline" if more_events else None
            ),
            "page_url": page_url,
            "stream_rows": self._stream_rows(run_id, run.pk),
            "run_created_iso": codec.format_iso(run.created_at),
        }

    def _stream_rows(self, run_id: str, run_pk: int) -> list[dict[str, Any]]:
        """The run's streams: registry ``run-streams:<runId>`` -> ``stream:<name>`` rows -> first/last chunks."""
        stream_base = reverse("admin:cells_run_stream", args=[run_pk])
        download_base = reverse("admin:cells_run_stream_download", args=[run_pk])
        names = list(
            StreamRegistration.objects.filter(cell=f"run-streams:{run_id}")
            .order_by("name")
            .values_list("name", flat=True)[:STREAMS_SHOWN]
        )
        if not names:
            return []
        streams = {s.name: s for s in Stream.objects.filter(name__in=[f"stream:{n}" for n in names])}
        wanted = Q()
        for s in streams.values():
            if s.count > 0:
                wanted |= Q(stream_id=s.pk, index=0) | Q(stream_id=s.pk, index=s.count - 1)
        chunks: dict[tuple[int, int], StreamChunk] = {}
        if wanted:
            rows = (
                StreamChunk.objects.filter(wanted)
                .defer("data", "value")
                .annotate(
                    **display.binary_annotations("data", head=CHUNK_PREVIEW_BYTES),
                    **display.payload_annotations("value", head=display.INLINE_HEAD_CHARS),
                )
            )
            chunks = {(c.stream_id, c.index): c for c in rows}
        out = []
        for name in names:
            stream = streams.get(f"stream:{name}")
            row: dict[str, Any] = {"name": name, "stream": stream}
            if stream is not None:
                query = urlencode({"name": name})
                row["view_url"] = f"{stream_base}?{query}"
                row["download_url"] = f"{download_base}?{query}"
            if stream is not None and stream.count > 0:
                row["first"] = self._chunk_preview(chunks.get((stream.pk, 0)))
                if stream.count > 1:
                    row["last"] = self._chunk_preview(chunks.get((stream.pk, stream.count - 1)))
            if stream is not None:
                row["state"] = status_badge("closed" if stream.closed else "open")
                row["updated"] = format_datetime(stream.updated_at)
            out.append(row)
        return out

    @staticmethod
    def _chunk_preview(chunk: StreamChunk | None) -> str:
        if chunk is None:
            return "—"
        head = getattr(chunk, "pv_data_head", None)
        if head is not None:
            return display.render_bytes(bytes(head), chunk.pv_data_size)
        return display.render_payload(display.stored_text(chunk, "value"), inline=True)

    # ------------------------------------------------------------------ step and event pages

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

    def live_view(self, request, object_id: int):
        """``<run>/live/``: the run page's live sections alone (status, waterfall, steps, log, hooks, streams)."""
        run = self._run_or_404(request, object_id)
        context = {**self._page_context(request, run, f"Run {run.cell.name}"), **self._run_sections(request, run)}
        return TemplateResponse(request, "admin/cells/run/live_sections.html", context)

    def stream_view(self, request, object_id: int):
        """``<run>/stream/?name=…&from=…&as=text|json|hex``: every chunk of a run's stream, a page at a time."""
        run = self._run_or_404(request, object_id)
        name = _id_or_404(request.GET.get("name"), "stream")
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
        return admin_streams.stream_download(run.cell.name, _id_or_404(request.GET.get("name"), "stream"))

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

    def _run_or_404(self, request, object_id) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), pk=row_pk_or_404(object_id))

    def by_id_view(self, request, run_id: str):
        """``/admin/cells/run/by-id/<runId>/`` -> the run page (for links from other pages), or its tombstone."""
        run_id = _id_or_404(run_id, "run")
        tomb = admin_lifecycle.tombstone_url(run_id) if self.has_view_permission(request) else None
        if tomb is not None:
            return HttpResponseRedirect(tomb)
        run = self._run_or_404_by_name(request, run_id)
        return HttpResponseRedirect(reverse("admin:cells_run_change", args=[run.pk]))

    def _run_or_404_by_name(self, request, run_id: str) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), cell__name=_id_or_404(run_id, "run"))

    def _page_context(self, request, run: Run, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "run": run,
            "run_id": run.cell.name,
            "run_url": reverse("admin:cells_run_change", args=[run.pk]),
            "title": title,
            "subtitle": None,
        }

    def step_view(self, request, object_id: int):
        """One step: its summary, decoded input/output/error, and its events."""
        run = self._run_or_404(request, object_id)
        step_id = _id_or_404(request.GET.get("id"), "step")
        annotations: dict[str, Any] = {}
        for name in STEP_PAYLOADS:
            annotations.update(display.payload_annotations(name))
        step = Step.objects.filter(run=run, step_id=step_id).defer(*STEP_PAYLOADS).annotate(**annotations).first()
        if step is None:
            raise Http404("no such step")
        now_ms = clock.now_ms()
        events = list(
            Event.objects.filter(run=run, correlation_id=step_id)
            .defer("body")
            .annotate(**display.payload_annotations("body", head=display.INLINE_HEAD_CHARS))
            .order_by("event_id")[:STEP_EVENTS_SHOWN]
        )
        context = self._page_context(request, run, f"Step {step_id}")
        context.update(
            step=step,
            status=status_badge(step.status),
            times=[
                ("created", format_datetime(step.created_at)),
                ("started (first attempt)", format_datetime(step.started_at)),
                ("completed", format_datetime(step.completed_at)),
                ("updated", format_datetime(step.updated_at)),
                ("retry after", format_datetime(step.retry_after, now_ms=now_ms, relative=True)),
            ],
            payloads=[
                ("input", display.render_payload(display.stored_text(step, "input"))),
                ("output", display.render_payload(display.stored_text(step, "output"))),
                ("error of an earlier attempt" if step.status == "completed" else "error",
                 display.render_structured_error(display.stored_text(step, "error"))),
            ],
            event_rows=[
                {
                    "event": e,
                    "family": _event_family(e.event_type),
                    "url": reverse("admin:cells_run_event", args=[run.pk, e.event_id]),
                    "time": format_datetime(e.created_at),
                    "preview": _event_data_preview(display.stored_text(e, "body")),
                }
                for e in events
            ],
        )
        return TemplateResponse(request, "admin/cells/run/step.html", context)

    def event_view(self, request, object_id: int, event_id: str):
        """One event of the log, decoded in full (bounded)."""
        run = self._run_or_404(request, object_id)
        event = (
            Event.objects.filter(run=run, event_id=_id_or_404(event_id, "event"))
            .defer("body")
            .annotate(**display.payload_annotations("body"))
            .first()
        )
        if event is None:
            raise Http404("no such event")
        context = self._page_context(request, run, f"Event {event.event_id}")
        step_link = None
        if event.correlation_id and _event_family(event.event_type) == "step":
            step_link = reverse("admin:cells_run_step", args=[run.pk]) + "?" + urlencode({"id": event.correlation_id})
        context.update(
            event=event,
            family=_event_family(event.event_type),
            time=format_datetime(event.created_at),
            body=display.render_payload(display.stored_text(event, "body")),
            step_link=step_link,
        )
        return TemplateResponse(request, "admin/cells/run/event.html", context)

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
