"""The run page's sections and its sub-pages: steps, the event log as a timeline, hooks, streams; step and event pages.

``RunPageMixin`` is mixed into ``cells.admin.RunAdmin`` (which keeps the
glue: ``render_change_form`` puts these sections, the actions and the stuck
note together). Each section reads one page of rows with bounded previews
(``worldcell.display``), so a run with a 5 MB output or 10,000 events
renders in a handful of queries:

* the page's fields — status with the duration, deployment and spec
  version, the times, the record counts, the decoded payloads;
* ``_run_sections`` — the context of the run page and of its live fragment
  (``<run>/live/``, ``live_view``): the waterfall (``cells.admin_waterfall``),
  one page of steps, one page of the event log (links to the step page or the
  hook), the live hooks and the run's streams (``cells.admin_streams.stream_rows``);
* ``step_view`` (``<run>/step/?id=…``) and ``event_view``
  (``<run>/event/<eventId>/``) — full decoded payloads (bounded) and the
  step's own events.

``id_or_404`` is the console's one check of ids taken from a URL, shared
with the run admin's other views.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from worldcell import clock, codec, display
from worldcell.admin_site import format_datetime, format_duration_ms, row_pk_or_404, status_badge
from worldcell.keys import storable_text

from . import admin_streams, admin_waterfall
from .admin_runlist import run_duration_ms
from .event_machine import TERMINAL_RUN
from .models import Event, Hook, HookMarker, Run, Step

__all__ = ["LIVE_EVERY_S", "RunPageMixin", "id_or_404"]


def id_or_404(text: str | None, what: str) -> str:
    """``text`` as a string id to look up (run, step, event id, a page cursor), or Http404.

    The console's one check of ids taken from a URL: a string no text column can hold
    (``worldcell.keys.storable_text``: a U+0000, an unpaired surrogate) names nothing, so it
    is "not found", never a query PostgreSQL refuses (DataError, an HTML 500).
    """
    if text is None or not storable_text(text):
        raise Http404(f"no such {what}")
    return text


#: Rows per page of the run page's sections.
STEPS_PER_PAGE = 100
EVENTS_PER_PAGE = 250
HOOKS_SHOWN = 200
STEP_EVENTS_SHOWN = 500
#: Seconds between two refreshes of a live fragment (run list results, run page sections).
LIVE_EVERY_S = 5

STEP_PAYLOADS = ("input", "output", "error")


def _event_family(event_type: str) -> str:
    """``run`` / ``step`` / ``hook`` / ``wait``: the timeline colour of an event type."""
    return event_type.split("_", 1)[0]


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


class RunPageMixin:
    """The run page's fields and sections, its live fragment, and the step and event pages (module docstring)."""

    # ------------------------------------------------------------------ the run page's fields

    @admin.display(description="status")
    def status_summary(self, obj: Run) -> str:
        ms, going = run_duration_ms(obj, clock.now_ms())
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

    # ------------------------------------------------------------------ the run page's sections

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
            events_qs = events_qs.filter(event_id__gt=id_or_404(events_after, "event"))
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
        ms, going = run_duration_ms(run, now_ms)
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
            "stream_rows": admin_streams.stream_rows(run_id, run.pk),
            "run_created_iso": codec.format_iso(run.created_at),
        }

    def live_view(self, request, object_id: int):
        """``<run>/live/``: the run page's live sections alone (status, waterfall, steps, log, hooks, streams)."""
        run = self._run_or_404(request, object_id)
        context = {**self._page_context(request, run, f"Run {run.cell.name}"), **self._run_sections(request, run)}
        return TemplateResponse(request, "admin/cells/run/live_sections.html", context)

    def _run_or_404(self, request, object_id) -> Run:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), pk=row_pk_or_404(object_id))

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
        step_id = id_or_404(request.GET.get("id"), "step")
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
            Event.objects.filter(run=run, event_id=id_or_404(event_id, "event"))
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
